//! Rich display over MCP: matplotlib figures and other images as image
//! content blocks, the display protocol (`display()`, `_repr_*_` methods,
//! IPython's display), and the limits on images per result.
//!
//! Sessions run the interpreter made by `scripts/test-env.sh`, which has
//! matplotlib, pandas, pillow and IPython.

use crate::support::{
    HttpServer, StdioServer, ToolOutput, assert_one_png, call, content_kinds, image_blocks,
    png_size, rich_python_arg,
};
use serde_json::json;

/// A stdio server whose sessions use the rich interpreter, plus `extra` flags.
async fn rich_server(extra: &[&str]) -> StdioServer {
    let python = rich_python_arg();
    let mut args = vec!["--python", python.as_str()];
    args.extend_from_slice(extra);
    StdioServer::start(&args).await
}

/// Asserts that a cell succeeded and attached no image.
fn assert_no_images(out: &ToolOutput) {
    out.assert_ok();
    assert!(
        image_blocks(out).is_empty(),
        "expected no image block, content kinds {:?}, text:\n{}",
        content_kinds(out),
        out.text
    );
}

const PIC_CLASS: &str = "\
import io
from PIL import Image

class Pic:
    def __init__(self, size=(4, 4), color='red'):
        self.size, self.color = size, color
    def _repr_png_(self):
        buf = io.BytesIO()
        Image.new('RGB', self.size, self.color).save(buf, 'PNG')
        return buf.getvalue()
";

#[tokio::test]
async fn matplotlib_show_returns_one_png_after_the_text_and_closes_the_figure() {
    let server = rich_server(&[]).await;
    let out = server
        .exec("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
        .await;
    out.assert_ok();
    let kinds = content_kinds(&out);
    assert_eq!(
        kinds,
        ["text", "image"],
        "content blocks, text:\n{}",
        out.text
    );
    let (width, height) = assert_one_png(&out);
    assert!(
        out.text
            .contains(&format!("[image 1: image/png {width}x{height},")),
        "the placeholder line should give the PNG's size {width}x{height}:\n{}",
        out.text
    );

    // The figure was closed once sent.
    let after = server.exec("plt.get_fignums()").await;
    after.assert_ok();
    assert_eq!(after.value(), Some("[]"), "{after:#?}");
    assert_no_images(&after);
}

#[tokio::test]
async fn a_figure_left_open_is_returned_and_a_figure_is_sent_once() {
    let server = rich_server(&[]).await;

    // No plt.show(): the open figure comes back at the end of the cell.
    let open = server
        .exec("import matplotlib.pyplot as plt\nfig = plt.figure()\n_ = plt.plot([3, 1, 2])")
        .await;
    open.assert_ok();
    assert_one_png(&open);
    let closed = server.exec("plt.get_fignums()").await;
    assert_eq!(closed.value(), Some("[]"), "{closed:#?}");

    // show() twice, then the end of the cell: still one image.
    let twice = server.exec("plt.plot([1]); plt.show(); plt.show()").await;
    twice.assert_ok();
    assert_one_png(&twice);
    assert_eq!(
        twice.display().len(),
        1,
        "one figure should be listed once: {:#?}",
        twice.structured["display"]
    );
    let closed = server.exec("plt.get_fignums()").await;
    assert_eq!(closed.value(), Some("[]"), "{closed:#?}");
}

#[tokio::test]
async fn an_image_sits_between_the_output_printed_before_and_after_it() {
    let server = rich_server(&[]).await;
    let out = server
        .exec(
            "import matplotlib.pyplot as plt\n\
             print('before')\n\
             plt.plot([1]); plt.show()\n\
             print('after')",
        )
        .await;
    out.assert_ok();
    assert_one_png(&out);
    let text = &out.text;
    let before = text.find("before").expect("'before' in the text");
    let image = text.find("[image 1: image/png").expect("placeholder");
    let after = text.find("after").expect("'after' in the text");
    assert!(
        before < image && image < after,
        "expected before < image placeholder < after in:\n{text}"
    );
    // The placeholder is on a line of its own.
    let line = text
        .lines()
        .find(|l| l.contains("[image 1:"))
        .expect("placeholder line");
    assert!(line.starts_with("[image 1:"), "placeholder line {line:?}");
    assert_eq!(out.str_field("stdout"), "before\nafter\n");
}

#[tokio::test]
async fn images_past_max_images_are_listed_but_not_attached() {
    let server = rich_server(&["--max-images", "2"]).await;
    let out = server
        .exec(
            "import matplotlib.pyplot as plt\n\
             for i in range(4):\n    \
                 plt.figure()\n    \
                 plt.title(f'figure {i}')\n    \
                 plt.plot([0, i + 1])\n    \
                 plt.show()",
        )
        .await;
    out.assert_ok();
    let images = image_blocks(&out);
    assert_eq!(images.len(), 2, "image blocks, text:\n{}", out.text);
    for image in &images {
        assert_eq!(image.mime, "image/png");
        png_size(&image.data);
    }
    let display = out.display();
    assert_eq!(display.len(), 4, "display items: {display:#?}");
    let shown: Vec<bool> = display
        .iter()
        .map(|d| d["shown"].as_bool().expect("shown is a boolean"))
        .collect();
    assert_eq!(shown, [true, true, false, false], "{display:#?}");
    for item in &display {
        assert_eq!(item["mime"], "image/png", "{item}");
        assert!(item["bytes"].as_u64().unwrap_or(0) > 0, "{item}");
    }
    assert!(
        out.text.contains("--max-images") && out.text.contains("at most 2 images"),
        "the text should say the limit was reached:\n{}",
        out.text
    );
    assert!(out.text.contains("[image 4 not shown"), "{}", out.text);
}

#[tokio::test]
async fn thousands_of_displays_list_the_first_and_count_the_rest() {
    let server = rich_server(&[]).await;
    let out = server
        .exec(
            "import base64\nfrom IPython.display import Image\n\
             png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')\n\
             for i in range(3000):\n    display(Image(data=png))",
        )
        .await;
    out.assert_ok();
    assert_eq!(image_blocks(&out).len(), 1, "the same picture is sent once");
    // MAX_DISPLAY_ENTRIES in src/session/report.rs.
    let listed = out.display().len();
    assert_eq!(listed, 64, "entries in the display list");
    let notes = out.notes_text();
    assert!(
        notes.contains("2936 more images were displayed than the 64"),
        "{notes}"
    );
    let size = serde_json::to_string(&out.raw).map_or(0, |s| s.len());
    assert!(
        size < 256 * 1024,
        "a result of 3000 displays is {size} bytes"
    );
}

#[tokio::test]
async fn an_image_over_max_image_bytes_is_not_attached() {
    let server = rich_server(&["--max-image-bytes", "100"]).await;
    let out = server
        .exec("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
        .await;
    assert_no_images(&out);
    assert!(
        out.text.contains("over the limit") && out.text.contains("--max-image-bytes"),
        "the text should say the image is over the limit:\n{}",
        out.text
    );
    assert!(
        out.display().iter().all(|d| d["shown"] != true),
        "{:#?}",
        out.structured["display"]
    );
    // The figure is closed all the same.
    let closed = server.exec("plt.get_fignums()").await;
    assert_eq!(closed.value(), Some("[]"), "{closed:#?}");
}

#[tokio::test]
async fn repr_png_objects_and_pil_images_become_image_blocks() {
    let server = rich_server(&[]).await;
    server.exec(PIC_CLASS).await.assert_ok();

    let last = server.exec("Pic()").await;
    last.assert_ok();
    assert_eq!(assert_one_png(&last), (4, 4));

    let shown = server.exec("display(Pic((3, 2), 'blue'))").await;
    shown.assert_ok();
    assert_eq!(assert_one_png(&shown), (3, 2));

    let pil = server.exec("Image.new('RGB', (6, 5), 'green')").await;
    pil.assert_ok();
    assert_eq!(assert_one_png(&pil), (6, 5));

    // The same picture twice in one result is attached once.
    let twice = server
        .exec("p = Pic((5, 5), 'white')\ndisplay(p)\ndisplay(p)")
        .await;
    twice.assert_ok();
    assert_eq!(image_blocks(&twice).len(), 1, "text:\n{}", twice.text);
    let display = twice.display();
    assert_eq!(display.len(), 2, "{display:#?}");
    assert_eq!(display[0]["shown"], true, "{display:#?}");
    assert_eq!(display[1]["shown"], false, "{display:#?}");
}

#[tokio::test]
async fn display_renders_markdown_html_and_mimebundles_as_text() {
    let server = rich_server(&[]).await;

    let builtin = server.exec("callable(display)").await;
    builtin.assert_ok();
    assert_eq!(builtin.value(), Some("True"), "display() without import");

    let markdown = server
        .exec(
            "class Md:\n    \
                 def _repr_markdown_(self):\n        \
                     return '# Title\\n\\n*emphasis* here'\n\
             display(Md())",
        )
        .await;
    assert_no_images(&markdown);
    assert!(
        markdown
            .str_field("stdout")
            .contains("# Title\n\n*emphasis* here"),
        "{markdown:#?}"
    );

    let html = server
        .exec(
            "class Page:\n    \
                 def _repr_html_(self):\n        \
                     return '<div><b>bold</b> and <i>italic</i></div>'\n\
             display(Page())",
        )
        .await;
    assert_no_images(&html);
    let stdout = html.str_field("stdout");
    assert!(stdout.contains("bold and italic"), "{html:#?}");
    assert!(!stdout.contains('<'), "HTML tags left in {stdout:?}");

    let bundle = server
        .exec(
            "class Bundle:\n    \
                 def _repr_mimebundle_(self, include=None, exclude=None):\n        \
                     return {'text/plain': 'PLAIN'}\n\
             display(Bundle())",
        )
        .await;
    assert_no_images(&bundle);
    assert!(bundle.str_field("stdout").contains("PLAIN"), "{bundle:#?}");
}

#[tokio::test]
async fn a_dataframe_value_is_a_compact_text_table() {
    let server = rich_server(&[]).await;
    let out = server
        .exec(
            "import pandas as pd\n\
             pd.DataFrame({'alpha': [1, 2, 3], 'beta': ['x', 'y', 'z']})",
        )
        .await;
    assert_no_images(&out);
    let value = out.value().expect("a DataFrame value");
    assert!(!value.contains("<table"), "HTML in the value:\n{value}");
    assert!(!value.contains('<'), "markup in the value:\n{value}");
    let lines: Vec<&str> = value.lines().collect();
    assert!(
        lines[0].contains("alpha") && lines[0].contains("beta"),
        "header line {:?} of\n{value}",
        lines[0]
    );
    for (index, (alpha, beta)) in [("1", "x"), ("2", "y"), ("3", "z")].iter().enumerate() {
        let row = index.to_string();
        assert!(
            lines.iter().any(|line| {
                let cells: Vec<&str> = line.split_whitespace().collect();
                cells == [row.as_str(), *alpha, *beta]
            }),
            "no row `{row} {alpha} {beta}` in\n{value}"
        );
    }
    assert!(
        value.len() < 200,
        "a 3x2 table should be compact, got {} bytes:\n{value}",
        value.len()
    );
}

#[tokio::test]
async fn ipython_display_is_routed_into_ferrepl() {
    let server = rich_server(&[]).await;
    let out = server
        .exec("from IPython.display import display, Markdown\ndisplay(Markdown('**hi**'))")
        .await;
    assert_no_images(&out);
    assert!(out.str_field("stdout").contains("**hi**"), "{out:#?}");

    // An image through IPython's display comes back as an image block.
    server.exec(PIC_CLASS).await.assert_ok();
    let image = server.exec("display(Pic((2, 3)))").await;
    image.assert_ok();
    assert_eq!(assert_one_png(&image), (2, 3));
}

#[tokio::test]
async fn a_magicmock_value_is_not_taken_for_an_image() {
    // The plain interpreter is enough: MagicMock is in the standard library.
    let server = StdioServer::start(&[]).await;
    let out = server
        .exec("from unittest.mock import MagicMock\nm = MagicMock()\nm")
        .await;
    assert_no_images(&out);
    assert!(out.display().is_empty(), "{out:#?}");
    assert!(out.structured["error"].is_null(), "{out:#?}");
    let value = out.value().expect("the mock's repr");
    assert!(value.contains("MagicMock"), "value {value:?}");

    let shown = server.exec("display(m)").await;
    assert_no_images(&shown);
    assert!(
        shown.str_field("stdout").contains("MagicMock"),
        "{shown:#?}"
    );
}

#[tokio::test]
async fn images_come_back_over_http_too() {
    let python = rich_python_arg();
    let server = HttpServer::start(&["--python", python.as_str()], &[]).await;
    let client = server.connect(None).await;
    let out = call(
        client.peer(),
        "python_exec",
        json!({ "code": "import matplotlib.pyplot as plt\nplt.plot([2, 4, 8])\nplt.show()" }),
    )
    .await;
    out.assert_ok();
    assert_eq!(content_kinds(&out), ["text", "image"], "{}", out.text);
    assert_one_png(&out);

    let table = call(
        client.peer(),
        "python_exec",
        json!({ "code": "import pandas as pd\npd.DataFrame({'col_a': [7]})" }),
    )
    .await;
    table.assert_ok();
    let value = table.value().expect("a DataFrame value");
    assert!(
        value.contains("col_a") && !value.contains("<table"),
        "{value}"
    );
    let _ = client.cancel().await;
}
