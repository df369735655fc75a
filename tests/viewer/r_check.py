"""The live viewer watching an R session in a real browser (Debian's chromium
through Selenium, as tests/viewer/browser_check.py, whose helpers it uses),
while the official MCP Python SDK runs R cells in a ferrepl started over
stdio with --languages python,r --viewer 127.0.0.1:0.

Asserted in the DOM: an R cell with its output and value, a running R cell's
output streaming in before it ends, a readline() prompt, a base-graphics
plot as an image, an error (its message shown once, no empty "full output"
link), and R text written to look like markup shown literally with no
script run. A screenshot goes to target/viewer-check/r.png.

    target/test-env/viewer-venv/bin/python tests/viewer/r_check.py
"""

import asyncio
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from browser_check import (OUT, XSS, browser, cell_text, full_output_links, no_script_ran,  # noqa: E402
                           served, traceback_of, wait_for)
from selenium.webdriver.common.by import By  # noqa: E402

SESSION = "rstats"


async def check():
    OUT.mkdir(parents=True, exist_ok=True)
    driver = browser()
    started = time.monotonic()
    try:
        async with served(["--languages", "python,r"]) as (client, base):

            async def run(code, wait_s=60):
                r = await client.call_tool("r_exec", {"code": code, "session": SESSION, "wait_s": wait_s})
                return "".join(getattr(c, "text", "") for c in r.content)

            out = await run("x <- 41\ncat('hello from R\\n')\nx + 1")
            assert "hello from R" in out, out
            driver.get(base + "s/" + SESSION)
            wait_for("R cell 1", lambda: "hello from R" in (cell_text(driver, 1) or ""))
            assert "42" in cell_text(driver, 1)

            # Streaming: the running R cell's output shows before it ends.
            await run("for (i in 0:7) { cat('tick', i, '\\n'); Sys.sleep(0.5) }", wait_s=0.3)
            wait_for("streamed R output", lambda: "tick 2" in driver.find_element(By.ID, "running").text)
            assert "tick 7" not in driver.find_element(By.ID, "running").text
            await client.call_tool("r_wait", {"session": SESSION, "wait_s": 30})
            wait_for("the R cell finished", lambda: "tick 7" in (cell_text(driver, 2) or ""))

            # readline(): the prompt shows while it waits.
            await run("who <- readline('your name? ')", wait_s=1)
            wait_for("the R prompt", lambda: "your name?" in driver.find_element(By.ID, "running").text)
            await client.call_tool("r_wait", {"session": SESSION, "input": "Ada", "wait_s": 30})

            # A plot, an error, and hostile text.
            await run("plot(1:10, main = 'an R plot')")
            wait_for("the R plot", lambda: driver.execute_script(
                "const i = document.querySelector('.cell img'); return i && i.complete && i.naturalWidth > 0"))
            await run("stop('boom from R')")
            wait_for("the R error", lambda: "boom from R" in driver.find_element(By.ID, "cells").text)
            tb = traceback_of(driver, 5)
            assert tb and tb.count("boom from R") == 1, tb
            # Full output only where there is some (cell 1 printed; the
            # error printed nothing).
            links = full_output_links(driver)
            assert "1" in links and "5" not in links and all(n > 0 for n in links.values()), links
            for payload in XSS:
                quoted = payload.replace("\\", "\\\\").replace("'", "\\'")
                await run(f"cat('{quoted}', '\\n')\n'{quoted}'")
            await run("cat('last R cell\\n')")
            wait_for("the last R cell", lambda: "last R cell" in driver.find_element(By.ID, "cells").text)
            page = driver.find_element(By.ID, "cells").text
            for payload in XSS:
                assert payload in page, f"not shown literally: {payload}"
            no_script_ran(driver)
            driver.execute_script("document.querySelector('.cell img').scrollIntoView()")
            driver.save_screenshot(str(OUT / "r.png"))

            # The list names the R session and its language.
            driver.get(base)
            wait_for("the R session listed", lambda: SESSION in driver.find_element(By.ID, "sessions").text)
    finally:
        driver.quit()
    print(f"viewer R check: ok in {time.monotonic() - started:.1f} s; screenshot in {OUT / 'r.png'}")


if __name__ == "__main__":
    asyncio.run(check())
