"""The live viewer (--viewer) in a real browser: Debian's chromium driven by
Selenium through /usr/bin/chromedriver, while the official MCP Python SDK
runs cells in a ferrepl started over stdio with --viewer 127.0.0.1:0.

Asserted in the DOM: a new cell with its output and value, the output of a
running cell streaming in, an input() prompt, an image, an error with its
traceback, a branch marker and the other branch's page (its download link
carrying that branch's head), a shell job's output streaming on its page,
and that what the agent writes stays text: <script>, </pre><img onerror>,
javascript: links, SVG with script, terminal escapes, invalid UTF-8 and a
10 MB output run no script (window.__pwned stays undefined, no alert) and
show literally. A traceback's last line shows once; "full output as text"
shows only where there is some; the icon loads and no request of a page
fails. At a phone's width (420 px) no page is wider than the screen, a long
session name is cut with an ellipsis (whole in its title), and a running
first cell is counted. In a kernel session, a cell a real jupyter_client
(attached with `ferrepl attach --print`) runs shows as it ends, marked as
another client's, after the agent's cell it followed, its hostile code and
output as text, and again on a page opened later.
Screenshots (session, list, dark theme, phone, kernel) go to
target/viewer-check/.

    target/test-env/viewer-venv/bin/python tests/viewer/browser_check.py \
        [--readme docs/viewer.png] [--phone docs/images/viewer-phone.png]

Environment: FERREPL_BIN (default target/debug/ferrepl), FERREPL_RICH_PYTHON
(the sessions' interpreter with matplotlib; default target/test-env/rich),
FERREPL_KERNELS_VENV (the venv with ipykernel's python3 kernelspec and
jupyter_client; default target/test-env/kernels).
"""

import argparse
import asyncio
import contextlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "target" / "viewer-check"
BIN = os.environ.get("FERREPL_BIN") or str(ROOT / "target" / "debug" / "ferrepl")
RICH = os.environ.get("FERREPL_RICH_PYTHON") or str(ROOT / "target" / "test-env" / "rich" / "bin" / "python")
KERNELS = pathlib.Path(os.environ.get("FERREPL_KERNELS_VENV") or ROOT / "target" / "test-env" / "kernels")

XSS = [
    "<script>window.__pwned = 1</script>",
    '</pre><img src=x onerror="window.__pwned = 2">',
    '<a href="javascript:window.__pwned = 3">click</a>',
    '<svg xmlns="http://www.w3.org/2000/svg" onload="window.__pwned = 4"><script>window.__pwned = 5</script></svg>',
]


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000",
                "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    # The console's messages, where a failed request (a 404) shows.
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=opts)


def wait_for(what, check, timeout=20.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as e:  # the DOM changes under us
            last = e
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def cell_text(driver, n):
    return driver.execute_script(
        "const c = document.querySelector('[data-cell=\"' + arguments[0] + '\"]'); return c ? c.innerText : null;", n)


def no_script_ran(driver):
    assert driver.execute_script("return window.__pwned") is None, "an agent's text ran as script"
    try:
        alert = driver.switch_to.alert
        raise AssertionError(f"an alert opened: {alert.text!r}")
    except NoAlertPresentException:
        pass


def traceback_of(driver, n):
    return driver.execute_script(
        "const t = document.querySelector('[data-cell=\"' + arguments[0] + '\"] pre.traceback');"
        " return t ? t.textContent : null;", n)


def full_output_links(driver):
    """{cell: bytes of its "full output as text"} for the cells showing the
    link (each fetched)."""
    return driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const links = Array.from(document.querySelectorAll('#cells .cell a'))
          .filter((a) => a.textContent === 'full output as text');
        Promise.all(links.map((a) => fetch(a.href).then((r) => r.ok ? r.text() : '')
          .then((body) => [a.closest('.cell').dataset.cell, body.length])))
          .then((pairs) => done(Object.fromEntries(pairs)), (e) => done(String(e)));""")


def icon_loads(driver):
    """The page's icon is served, as an SVG image."""
    got = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const icon = document.querySelector('link[rel=icon]');
        if (!icon) { done('no icon link'); return; }
        fetch(icon.href).then((r) => done([r.status, r.headers.get('content-type')]), (e) => done(String(e)));""")
    assert got == [200, "image/svg+xml"], got


def failed_requests(driver):
    """Console messages of requests that failed (404s and the like) since
    the last look."""
    return [e["message"] for e in driver.get_log("browser") if "Failed to load resource" in e["message"]]


def fits_the_screen(driver, what, screen):
    """No wider than the screen: a phone widens its layout (innerWidth) to
    what overflows, so both are held to the screen's width."""
    wide, inner = driver.execute_script(
        "return [document.documentElement.scrollWidth, window.innerWidth]")
    assert wide <= inner <= screen, f"{what} is {wide} px wide ({inner} px laid out) on a {screen} px screen"


@contextlib.asynccontextmanager
async def served(extra, env=None):
    """ferrepl over stdio with --viewer 127.0.0.1:0 (and `extra`, and `env`
    in its environment), in a workspace and state of its own: an MCP client
    of it and the viewer's URL. Everything is removed afterwards."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="ferrepl-viewer-"))
    work = tmp / "work"
    work.mkdir()
    args = ["--workdir", str(work), "--viewer", "127.0.0.1:0", "--state-dir", str(tmp / "state"), *extra]
    params = StdioServerParameters(command=BIN, args=args, env={"XDG_STATE_HOME": str(tmp / "xdg"), **(env or {})})
    try:
        with open(tmp / "stderr.log", "w+") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                url = wait_for("the viewer's URL on stderr", lambda: re.search(
                    r"ferrepl viewer: (http://\S+)", (tmp / "stderr.log").read_text()))
                yield client, url.group(1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def check(readme, phone):
    OUT.mkdir(parents=True, exist_ok=True)
    extra = ["--tools", "all"] + (["--python", RICH] if os.access(RICH, os.X_OK) else [])
    driver = browser()
    started = time.monotonic()
    try:
        async with served(extra) as (client, base):

            async def run(code, **kw):
                r = await client.call_tool("python_exec", {"code": code, "wait_s": kw.pop("wait_s", 30), **kw})
                return "".join(getattr(c, "text", "") for c in r.content)

            await run("x = 41\nprint('hello from cell 1')\nx + 1")
            driver.get(base + "s/default")
            wait_for("cell 1", lambda: "hello from cell 1" in (cell_text(driver, 1) or ""))
            assert "42" in cell_text(driver, 1)
            icon_loads(driver)
            # A cell that runs after the page opened arrives by itself.
            await run("import math\nmath.sqrt(x + 8)")
            wait_for("cell 2 pushed", lambda: "7.0" in (cell_text(driver, 2) or ""))

            # Streaming: a running cell's output shows before it ends.
            await run("import time\nfor i in range(8):\n    print('tick', i, flush=True)\n    time.sleep(0.5)",
                      wait_s=0.3)
            wait_for("streamed output", lambda: "tick 2" in driver.find_element(By.ID, "running").text)
            assert "tick 7" not in driver.find_element(By.ID, "running").text
            await client.call_tool("python_wait", {"wait_s": 30})
            wait_for("cell 3 finished", lambda: "tick 7" in (cell_text(driver, 3) or ""))

            # input(): the prompt shows.
            await run("name = input('your name? ')", wait_s=0.5)
            wait_for("the input prompt", lambda: "your name?" in driver.find_element(By.ID, "running").text)
            await client.call_tool("python_wait", {"input": "Ada", "wait_s": 10})

            # An image and an error.
            if os.access(RICH, os.X_OK):
                await run("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                          "plt.plot([1, 3, 2, 4]); plt.title('a plot'); plt.show()")
                wait_for("an image", lambda: driver.execute_script(
                    "const i = document.querySelector('.cell img'); return i && i.complete && i.naturalWidth > 0"))
            await run("def f():\n    return 1 / 0\nf()")
            wait_for("the traceback", lambda: "ZeroDivisionError" in driver.find_element(By.ID, "cells").text)
            error_cell = 6 if os.access(RICH, os.X_OK) else 5
            tb = traceback_of(driver, error_cell)
            assert tb and tb.count("ZeroDivisionError: division by zero") == 1, tb
            # Full output only where there is some: cell 1 printed, cell 2
            # only has a value, the error cell printed nothing.
            links = full_output_links(driver)
            assert "1" in links and "2" not in links and str(error_cell) not in links, links
            assert all(n > 0 for n in links.values()), links

            # The agent's text, hostile.
            for payload in XSS:
                await run(f"print({payload!r})\n{payload!r}")
            await run("print('\\x1b[31mred\\x1b[0m \\x1b]0;title\\x07 done')")
            await run("import sys\nsys.stdout.flush(); sys.stdout.buffer.write(b'bad \\xff\\xfe bytes\\n'); sys.stdout.flush()")
            await run("print('y' * 10_000_000)")
            await run("print('after the flood')")
            wait_for("the last cell", lambda: "after the flood" in driver.find_element(By.ID, "cells").text, 60)
            page = driver.find_element(By.ID, "cells").text
            for payload in XSS:
                assert payload in page, f"not shown literally: {payload}"
            assert "\u241b[31mred" in page, "the escape is shown, not acted on"
            assert "bad \ufffd\ufffd bytes" in page
            no_script_ran(driver)
            assert driver.find_elements(By.CSS_SELECTOR, "img[src^='x']") == []
            # Responsive after the flood: a script answers at once.
            t = time.monotonic()
            driver.execute_script("return document.querySelectorAll('.cell').length")
            assert time.monotonic() - t < 2
            links = [a.get_attribute("href") for a in driver.find_elements(By.TAG_NAME, "a")]
            assert not any(h and h.startswith("javascript:") for h in links), links

            driver.save_screenshot(str(OUT / "session.png"))
            await client.call_tool("shell_exec", {"command": "echo '<b>job</b>'; sleep 30", "wait_s": 0.2})

            # A branch: cell 2 again on cell 1's state.
            await run("x * 2", parent=1)
            wait_for("a branch marker", lambda: "branches here" in driver.find_element(By.ID, "cells").text)
            driver.save_screenshot(str(OUT / "session-end.png"))
            marker = driver.find_element(By.CSS_SELECTOR, ".branch a")
            marker.click()
            wait_for("the other branch", lambda: "another branch" in driver.find_element(By.ID, "branch-note").text)
            wait_for("its cells", lambda: "7.0" in (cell_text(driver, 2) or ""))
            # The download is the notebook of the branch shown.
            href = driver.find_element(By.ID, "download").get_attribute("href")
            assert re.search(r"/s/default/export\.ipynb\?head=2$", href), href

            # A shell job's page: its command as text, its output streaming in.
            r = await client.call_tool("shell_exec", {
                "command": "for i in 1 2 3 4 5 6; do echo \"job tick $i <i>x</i>\"; sleep 0.5; done",
                "wait_s": 0.2})
            job = (getattr(r, "structured_content", None) or {}).get("job") or re.search(r"\bj\d+\b", "".join(
                getattr(c, "text", "") for c in r.content)).group(0)
            driver.get(base + "j/" + job)
            wait_for("the job's command", lambda: "job tick $i" in driver.find_element(By.ID, "command").text)
            wait_for("streamed job output", lambda: "job tick 2 <i>x</i>" in driver.find_element(By.ID, "output").text)
            assert "job tick 6" not in driver.find_element(By.ID, "output").text
            wait_for("the job's end", lambda: "exit 0" in driver.find_element(By.ID, "state").text)
            wait_for("all its output", lambda: "job tick 6 <i>x</i>" in driver.find_element(By.ID, "output").text)
            assert driver.find_elements(By.CSS_SELECTOR, "#output i, #command i") == []
            no_script_ran(driver)
            driver.save_screenshot(str(OUT / "job.png"))

            # The list (with the job, its command as text), the dark theme.
            driver.get(base)
            wait_for("the list", lambda: "default" in driver.find_element(By.ID, "sessions").text)
            wait_for("the job", lambda: "<b>job</b>" in driver.find_element(By.ID, "jobs").text)
            driver.save_screenshot(str(OUT / "list.png"))
            driver.execute_cdp_cmd("Emulation.setEmulatedMedia",
                                   {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
            driver.get(base + "s/default")
            wait_for("cells in the dark", lambda: "hello from cell 1" in (cell_text(driver, 1) or ""))
            bg = driver.execute_script("return getComputedStyle(document.body).backgroundColor")
            assert bg != "rgb(251, 251, 250)", bg
            driver.save_screenshot(str(OUT / "session-dark.png"))
            no_script_ran(driver)
            driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
            await phone_check(run, client, driver, base, phone)
            assert failed_requests(driver) == [], "a request of a page failed"
            if readme:
                await readme_shot(run, client, driver, base, readme)
        await kernel_check(driver)
        assert failed_requests(driver) == [], "a request of a page failed"
    finally:
        driver.quit()
    print(f"viewer browser check: ok in {time.monotonic() - started:.1f} s; screenshots in {OUT}")


# A real Jupyter client: runs argv[2] in the kernel of connection file
# argv[1] and waits for its end.
JUPYTER_CLIENT = """import sys, jupyter_client
c = jupyter_client.BlockingKernelClient()
c.load_connection_file(sys.argv[1])
c.start_channels()
c.wait_for_ready(timeout=60)
r = c.execute_interactive(sys.argv[2], timeout=60)
print('STATUS', r['content']['status'])
"""

OPERATOR_XSS = '<img src=x onerror="window.__pwned = 9">'


def page_order(driver):
    """The cells on the page, in order: the agent's by number, another
    client's as f<seq>."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#cells > .cell'),"
        " (n) => n.dataset.foreign !== undefined ? 'f' + n.dataset.foreign : n.dataset.cell)")


def foreign_text(driver):
    return driver.execute_script(
        "const f = document.querySelector('#cells .cell.foreign'); return f ? f.innerText : null")


async def kernel_check(driver):
    """A kernel session (--kernels python3) whose kernel a real
    jupyter_client, on the connection file `ferrepl attach --print` finds,
    runs a cell in: the open page shows it as it ends, marked as another
    client's, after the agent's cell 1 and before its cell 2, its hostile
    code and output as text; a page opened later shows it the same."""
    runtime = pathlib.Path(tempfile.mkdtemp(prefix="ferrepl-runtime-"))
    env = {"JUPYTER_PATH": str(KERNELS / "share" / "jupyter"), "XDG_RUNTIME_DIR": str(runtime)}
    try:
        async with served(["--tools", "all", "--kernels", "python3"], env) as (client, base):

            async def run(code):
                r = await client.call_tool("python_exec", {"session": "k", "code": code, "wait_s": 60})
                return "".join(getattr(c, "text", "") for c in r.content)

            r = await client.call_tool("python_sessions", {"action": "create", "session": "k", "kernel": "python3"})
            assert not r.is_error, r
            await run("x = 1\nprint('the agent, cell 1')")
            driver.get(base + "s/k")
            wait_for("cell 1", lambda: "the agent, cell 1" in (cell_text(driver, 1) or ""), 60)

            found = subprocess.run([BIN, "attach", "k", "--print"], capture_output=True, text=True, timeout=60,
                                   env={**os.environ, **env})
            assert found.returncode == 0, found
            code = f"s = {OPERATOR_XSS!r}\nprint(s)\nprint('from the operator')"
            ran = subprocess.run([str(KERNELS / "bin" / "python"), "-c", JUPYTER_CLIENT, found.stdout.strip(), code],
                                 capture_output=True, text=True, timeout=120)
            assert "STATUS ok" in ran.stdout, ran
            # Live: no call of the agent's looked at the session since.
            wait_for("the other client's cell", lambda: "from the operator" in (foreign_text(driver) or ""), 30)
            shown = foreign_text(driver)
            assert "run by another client" in shown, shown
            assert shown.count(OPERATOR_XSS) == 2, f"not shown literally in its code and output: {shown}"
            no_script_ran(driver)
            assert driver.find_elements(By.CSS_SELECTOR, "img[src^='x']") == []

            out = await run("s[:4]")
            assert "Someone else" in out, f"the viewer took the agent's note: {out}"
            wait_for("cell 2", lambda: "'<img'" in (cell_text(driver, 2) or ""), 30)
            assert page_order(driver) == ["1", "f1", "2"], page_order(driver)
            driver.save_screenshot(str(OUT / "kernel.png"))

            driver.get(base + "s/k")
            wait_for("the page opened later", lambda: page_order(driver) == ["1", "f1", "2"])
            assert "run by another client" in foreign_text(driver)
            no_script_ran(driver)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


PHONE = {"width": 420, "height": 900, "deviceScaleFactor": 1, "mobile": True}


async def phone_check(run, client, driver, base, shot):
    """At a phone's width: the list with a long name and a running first
    cell, then a tidy session (output, a plot, a traceback) whose picture
    goes to target/viewer-check/phone.png (and to `shot`)."""
    long_name = "a-session-whose-name-is-far-too-long-for-a-phone"
    await run("answer = input('ready? ')", session=long_name, wait_s=0.5)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
    try:
        driver.get(base)
        row = """const a = Array.from(document.querySelectorAll('#sessions a.name'))
                   .find((a) => a.title === arguments[0]);
                 return a && Array.from(a.closest('tr').children, (td) => td.textContent);"""
        wait_for("the running first cell counted", lambda: (driver.execute_script(row, long_name) or [])[4:5]
                 == ["1 (1 running)"])
        fits_the_screen(driver, "the list", PHONE["width"])
        cut = driver.execute_script("""
            const a = Array.from(document.querySelectorAll('#sessions a.name')).find((a) => a.title === arguments[0]);
            return [a.getClientRects().length, a.scrollWidth > a.clientWidth, getComputedStyle(a).textOverflow];""",
                                    long_name)
        assert cut == [1, True, "ellipsis"], f"the long name is not on one line, cut with an ellipsis: {cut}"
        await client.call_tool("python_wait", {"session": long_name, "input": "yes", "wait_s": 10})
        wait_for("the finished first cell counted", lambda: (driver.execute_script(row, long_name) or [])[3:5]
                 == ["", "1"])

        await run("temps = {'Lyon': 14.2, 'Oslo': 6.1, 'Quito': 13.9}\n"
                  "for city, t in temps.items():\n    print(f'{city:6} {t:5.1f} °C')\n"
                  "round(sum(temps.values()) / len(temps), 2)", session="weather")
        if os.access(RICH, os.X_OK):
            await run("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                      "plt.figure(figsize=(4, 2.2))\nplt.bar(list(temps), list(temps.values()))\n"
                      "plt.title('temperature (°C)'); plt.tight_layout(); plt.show()", session="weather")
        await run("temps['Paris']", session="weather")
        driver.get(base + "s/weather")
        wait_for("the traceback", lambda: "KeyError" in driver.find_element(By.ID, "cells").text)
        if os.access(RICH, os.X_OK):
            wait_for("the plot", lambda: driver.execute_script(
                "const i = document.querySelector('.cell img'); return i && i.complete && i.naturalWidth > 0"))
        last = driver.execute_script("return document.querySelector('#cells .cell:last-child').dataset.cell")
        assert traceback_of(driver, last).count("KeyError: 'Paris'") == 1, traceback_of(driver, last)
        assert list(full_output_links(driver)) == ["1"], full_output_links(driver)
        fits_the_screen(driver, "the session", PHONE["width"])
        tall = driver.execute_script("return document.documentElement.scrollHeight")
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**PHONE, "height": min(tall, 2400)})
        driver.save_screenshot(str(OUT / "phone.png"))
        if shot:
            shot.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(OUT / "phone.png", shot)
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


async def readme_shot(run, client, driver, base, path):
    """A tidy session for README's picture."""
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    await run("import pandas as pd\ndf = pd.DataFrame({'city': ['Lyon', 'Oslo', 'Quito'], 'temp': [14.2, 6.1, 13.9]})\n"
              "print(df.describe().loc[['mean', 'max']])\ndf['temp'].mean()", session="analysis")
    await run("import matplotlib.pyplot as plt\nplt.figure(figsize=(5, 2.4))\nplt.bar(df.city, df.temp)\n"
              "plt.title('mean temperature'); plt.show()", session="analysis")
    await run("import time\nfor step in range(100):\n    print(f'fitting step {step}', flush=True)\n    time.sleep(0.2)",
              session="analysis", wait_s=1.5)
    driver.set_window_size(1100, 1300)
    driver.get(base + "s/analysis")
    wait_for("the picture", lambda: "fitting step" in driver.find_element(By.ID, "running").text)
    driver.save_screenshot(str(path))
    await client.call_tool("python_wait", {"session": "analysis", "interrupt": True, "wait_s": 10})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--readme", type=pathlib.Path, help="also save README's screenshot here")
    parser.add_argument("--phone", type=pathlib.Path, help="also save the phone-width screenshot here")
    ns = parser.parse_args()
    if not (os.access("/usr/bin/chromium", os.X_OK) and os.access("/usr/bin/chromedriver", os.X_OK)):
        sys.exit("no /usr/bin/chromium or /usr/bin/chromedriver: run scripts/test-env.sh")
    if not (KERNELS / "share" / "jupyter" / "kernels" / "python3" / "kernel.json").is_file():
        sys.exit(f"{KERNELS} has no python3 kernel: run scripts/test-env.sh")
    asyncio.run(check(ns.readme, ns.phone))
