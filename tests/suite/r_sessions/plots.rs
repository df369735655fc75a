//! R plots as PNG images: one per plot, seven by five inches, ggplot objects
//! drawn when visible or printed.

use super::{SLOW_WAIT_S, assert_r_ok, r_exec, r_exec_in, r_server};
use crate::support::{ImageBlock, assert_one_png, content_kinds, image_blocks, png_size};

/// Panics unless `image` is a PNG of about 700x500 (7x5 in at 100 dpi).
fn assert_seven_by_five(image: &ImageBlock) {
    assert_eq!(image.mime, "image/png");
    let (width, height) = png_size(&image.data);
    assert!(
        (665..=735).contains(&width) && (475..=525).contains(&height),
        "a plot should be about 700x500 pixels, got {width}x{height}"
    );
}

#[tokio::test]
async fn a_plot_is_one_png_of_seven_by_five_inches() {
    let server = r_server().await;
    let out = r_exec(&server, "plot(1:10)").await;
    assert_r_ok(&out);
    assert_one_png(&out);
    assert_seven_by_five(&image_blocks(&out)[0]);

    // The plot was sent once: the next cell has no image.
    let after = r_exec(&server, "1").await;
    assert_r_ok(&after);
    assert!(image_blocks(&after).is_empty(), "{after:#?}");
}

#[tokio::test]
async fn two_plots_in_one_cell_are_two_images_in_order() {
    let server = r_server().await;
    // A nearly empty plot, then a dense cloud of points (a much bigger PNG).
    let code = "plot(1:2, axes = FALSE, ann = FALSE)\n\
                set.seed(1); plot(runif(3000), runif(3000))";
    let out = r_exec(&server, code).await;
    assert_r_ok(&out);
    let images = image_blocks(&out);
    assert_eq!(
        images.len(),
        2,
        "content kinds {:?}, text:\n{}",
        content_kinds(&out),
        out.text
    );
    for image in &images {
        assert_seven_by_five(image);
    }
    assert!(
        images[0].data.len() < images[1].data.len(),
        "the sparse plot comes first: {} vs {} bytes",
        images[0].data.len(),
        images[1].data.len()
    );
    let display = out.display();
    assert_eq!(display.len(), 2, "{display:#?}");
    let first = out.text.find("[image 1: image/png").expect("placeholder 1");
    let second = out.text.find("[image 2: image/png").expect("placeholder 2");
    assert!(first < second, "{}", out.text);
}

#[tokio::test]
async fn ggplot_objects_are_drawn_when_visible_or_printed() {
    let server = r_server().await;
    let code = "library(ggplot2); ggplot(mtcars, aes(wt, mpg)) + geom_point()";
    let visible = r_exec_in(&server, "r", code, SLOW_WAIT_S).await;
    assert_r_ok(&visible);
    assert_one_png(&visible);
    assert_seven_by_five(&image_blocks(&visible)[0]);

    let code = "p <- ggplot(mtcars, aes(wt, mpg)) + geom_point(); print(p)";
    let printed = r_exec_in(&server, "r", code, SLOW_WAIT_S).await;
    assert_r_ok(&printed);
    assert_one_png(&printed);

    // Assigned and not printed: no image.
    let quiet = r_exec(&server, "q <- ggplot(mtcars, aes(wt, mpg)) + geom_point()").await;
    assert_r_ok(&quiet);
    assert!(image_blocks(&quiet).is_empty(), "{quiet:#?}");
}
