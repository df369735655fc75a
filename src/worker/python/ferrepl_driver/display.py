"""Values and rich display: repr of values, the display protocol, images,
matplotlib and IPython hooks.

Text forms of displayed objects are written to stdout, in order with the
rest of the output. Images travel as fenced `display` events; the server
puts a placeholder line where each image appeared and returns the image as
an MCP image block.
"""

import base64
import builtins
import importlib.util
import io
import json
import os
import sys

from .channel import send_fenced, state

MAX_VALUE_CHARS = int(os.environ.pop("FERREPL_MAX_VALUE_CHARS", "200000") or 200000)
MAX_IMAGE_BYTES = int(os.environ.pop("FERREPL_MAX_IMAGE_BYTES", "4194304") or 4194304)


def format_value(value):
    try:
        text = repr(value)
    except Exception as exc:
        text = "<repr failed: %s: %s>" % (type(exc).__name__, exc)
    if len(text) > MAX_VALUE_CHARS:
        cut = len(text) - MAX_VALUE_CHARS
        text = text[:MAX_VALUE_CHARS] + "... [%d more characters of repr]" % cut
    return text


_REPR_METHODS = (
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("image/svg+xml", "_repr_svg_"),
    ("text/markdown", "_repr_markdown_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("text/html", "_repr_html_"),
)


def _class_method(obj, name):
    """A display method, looked up on the class: objects that answer every
    attribute (mocks, proxies) must not pass for displayable."""
    if isinstance(obj, type):
        return None
    if getattr(type(obj), name, None) is None:
        return None
    method = getattr(obj, name, None)
    return method if callable(method) else None


def mime_bundle(obj):
    bundle = {}
    method = _class_method(obj, "_repr_mimebundle_")
    if method is not None:
        try:
            result = method(include=None, exclude=None)
            if isinstance(result, tuple):
                result = result[0]
            if isinstance(result, dict):
                bundle.update(result)
        except Exception:
            pass
    for mime, name in _REPR_METHODS:
        if mime in bundle:
            continue
        method = _class_method(obj, name)
        if method is None:
            continue
        try:
            result = method()
        except Exception:
            continue
        if isinstance(result, tuple):
            result = result[0]
        if result is not None:
            bundle[mime] = result
    return bundle


_BARE_REPR = None


def _has_default_repr(obj):
    """True when repr() says nothing but the type: '<x.Y object at 0x...>'."""
    global _BARE_REPR
    if type(obj).__repr__ is object.__repr__:
        return True
    if _BARE_REPR is None:
        import re

        _BARE_REPR = re.compile(r"^<[\w.]+ object( at 0x[0-9a-fA-F]+)?>$")
    try:
        return bool(_BARE_REPR.match(repr(obj)))
    except Exception:
        return True


def _html_to_text(html):
    import html as html_module
    import re

    text = re.sub(r"(?is)<(script|style).*?</\1>", "", str(html))
    text = re.sub(r"(?i)<br\s*/?>|</(p|div|tr|li|h[1-6])>", "\n", text)
    text = re.sub(r"(?i)</t[dh]>", "\t", text)
    text = re.sub(r"<[^>]+>", "", text)
    lines = [line.rstrip() for line in html_module.unescape(text).splitlines()]
    return "\n".join(line for line in lines if line.strip())


def text_form(obj, bundle):
    """The form an LLM reads best: markdown, then plain text; HTML last."""
    if "text/markdown" in bundle:
        return str(bundle["text/markdown"])
    if "text/plain" in bundle:
        return str(bundle["text/plain"])
    if not _has_default_repr(obj):
        return format_value(obj)
    if "text/latex" in bundle:
        return str(bundle["text/latex"])
    if "application/json" in bundle:
        try:
            return json.dumps(bundle["application/json"], indent=1, default=str)
        except Exception:
            pass
    if "text/html" in bundle:
        return _html_to_text(bundle["text/html"])
    return format_value(obj)


def _image_bytes(data):
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, str):
        try:
            return base64.b64decode(data, validate=False)
        except Exception:
            return None
    return None


def _png_size(data):
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    return None, None


def emit_image(mime, data):
    """Sends one image to the server (fenced, so it lands at its place in the output)."""
    if len(data) > MAX_IMAGE_BYTES:
        sys.stdout.write(
            "[image not shown: %s of %d bytes is over the limit of %d bytes (--max-image-bytes); "
            "save it smaller, e.g. with a lower dpi]\n" % (mime, len(data), MAX_IMAGE_BYTES)
        )
        return
    import hashlib  # only when there is an image: it costs ~4 ms at start-up

    width, height = _png_size(data) if mime == "image/png" else (None, None)
    send_fenced(
        {
            "ev": "display",
            "cell": state.cell,
            "mime": mime,
            "data": base64.b64encode(data).decode("ascii"),
            "bytes": len(data),
            "width": width,
            "height": height,
            "sha": hashlib.sha1(data).hexdigest(),
        }
    )


def render_object(obj):
    """Displays one object: images as images, the rest as text on stdout.
    Returns the text form, or None when an image said it all."""
    bundle = mime_bundle(obj)
    shown_image = False
    for mime in ("image/png", "image/jpeg"):
        if mime in bundle:
            data = _image_bytes(bundle[mime])
            if data:
                emit_image(mime, data)
                shown_image = True
                break
    if not shown_image and "image/svg+xml" in bundle:
        svg = bundle["image/svg+xml"]
        sys.stdout.write(
            "[SVG image of %d characters not shown: MCP clients take raster images; "
            "render it to PNG to see it]\n" % len(str(svg))
        )
    text = text_form(obj, bundle)
    if shown_image and _has_default_repr(obj) and not ({"text/markdown", "text/plain"} & set(bundle)):
        return None
    return text


def display(*objs, **kwargs):
    """Show objects in the result: images as images, others as their best text form."""
    for obj in objs:
        text = render_object(obj)
        if text is not None:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")


def displayhook(value):
    if value is None:
        return
    builtins._ = value
    text = render_object(value)
    state.value = text if text is not None else format_value(value)


# ---------------------------------------------------------------- matplotlib


def _pyplot_is_ours(plt):
    try:
        backend = str(plt.get_backend()).lower()
    except Exception:
        return False
    return backend in ("agg", "module://matplotlib_inline.backend_inline")


def flush_figures():
    """Sends every open pyplot figure as a PNG and closes it."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or not _pyplot_is_ours(plt):
        return
    try:
        numbers = list(plt.get_fignums())
    except Exception:
        return
    for number in numbers:
        try:
            figure = plt.figure(number)
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", bbox_inches="tight")
            plt.close(figure)
        except Exception as exc:
            sys.stderr.write("[figure %s could not be rendered: %s]\n" % (number, exc))
            continue
        emit_image("image/png", buffer.getvalue())


def _patch_pyplot(plt):
    original_show = plt.show

    def show(*args, **kwargs):
        if _pyplot_is_ours(plt):
            flush_figures()
            return None
        return original_show(*args, **kwargs)

    show.__doc__ = original_show.__doc__
    plt.show = show


def _patch_ipython_display(module):
    if hasattr(module, "display"):
        module.display = display


_IMPORT_HOOKS = {
    "matplotlib.pyplot": _patch_pyplot,
    "IPython.display": _patch_ipython_display,
    "IPython.core.display_functions": _patch_ipython_display,
    "IPython.core.display": _patch_ipython_display,
}


class _HookedLoader:
    def __init__(self, loader, hook):
        self._loader = loader
        self._hook = hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._hook(module)
        except Exception:
            pass

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _PostImportFinder:
    """Patches a few modules right after they are imported (without importing
    them ourselves: matplotlib and IPython are slow to import). A plain
    class: the import system needs only find_spec, and importlib.abc costs
    ~8 ms of every interpreter's start (it imports importlib.resources)."""

    def __init__(self):
        self._busy = set()

    def find_spec(self, name, path=None, target=None):
        hook = _IMPORT_HOOKS.get(name)
        if hook is None or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        except Exception:
            spec = None
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _HookedLoader(spec.loader, hook)
        return spec


def install_display():
    builtins.display = display
    sys.displayhook = displayhook
    sys.meta_path.insert(0, _PostImportFinder())
    for name, hook in _IMPORT_HOOKS.items():
        module = sys.modules.get(name)
        if module is not None:
            hook(module)
