"""Screenshots of the dashboard in headless Chromium: the best-configuration panel, the whole
page of one study, and its decision views (the timeline of trials per GPU slot, the loss
curves of ticked trials over the baseline's, the studies of the model side by side), served
by ``dse serve`` on a free port.

    python scripts/dashboard_screenshot.py --storage sqlite:///dse.db --study NAME \\
        [--out docs/results/dashboard_best.png] [--page docs/results/dashboard.png] \\
        [--views docs/results/dashboard] [--pick 3,5]

``--views PREFIX`` writes ``PREFIX_timeline.png``, ``PREFIX_losses.png`` (the trials of
``--pick`` ticked; default: the best) and ``PREFIX_compare.png``.

Needs Playwright (the ``dev`` extra) and a Chromium (``$DSE_CHROMIUM``, default Debian's
/usr/bin/chromium); nothing is downloaded and no other host is contacted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--storage", required=True)
    ap.add_argument("--study", required=True)
    ap.add_argument("--out", help="PNG of the best-configuration panel")
    ap.add_argument("--views", help="prefix of the PNGs of the timeline, losses and comparison")
    ap.add_argument("--pick", default="", help="trial numbers to tick for the loss curves (1,2)")
    ap.add_argument("--page", help="PNG of the whole page (optional)")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--format", default="megatron", choices=["megatron", "bridge", "nemo"])
    args = ap.parse_args(argv)

    from playwright.sync_api import sync_playwright

    serve = subprocess.Popen(
        [sys.executable, "-m", "dse.cli", "serve", "--port", "0", "--storage", args.storage],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
        if " at http" not in line:
            sys.stderr.write(f"dse serve did not start: {line}\n")
            return 1
        base = line.split(" at ", 1)[1].split("/ ", 1)[0]
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=os.environ.get("DSE_CHROMIUM", "/usr/bin/chromium"),
                args=CHROMIUM_ARGS,
            )
            page = browser.new_page(viewport={"width": args.width, "height": 900})
            page.goto(f"{base}/#study={args.study}")
            page.wait_for_selector('#study-view[data-rendered="true"]', timeout=30_000)
            if args.out:
                page.wait_for_selector('#best-panel[data-state="shown"]', timeout=30_000)
                tab = page.locator(f'#best-panel .tab[data-format="{args.format}"]')
                if tab.is_enabled():  # disabled: the best has no equivalent in that target
                    tab.click()
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                page.locator("#best-panel").screenshot(path=args.out)
                sys.stdout.write(f"wrote {args.out}\n")
            if args.views:
                _views(page, args.views, [int(n) for n in args.pick.split(",") if n.strip()])
            if args.page:
                page.screenshot(path=args.page, full_page=True)
                sys.stdout.write(f"wrote {args.page}\n")
            browser.close()
    finally:
        serve.terminate()
        serve.wait(timeout=20)
    return 0


def _views(page: object, prefix: str, pick: list[int]) -> None:
    """The timeline, the loss curves (``pick`` ticked) and the comparison, one PNG each."""
    pg: Any = page
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    for n in pick:
        box = pg.locator(f'#trial-table input.pick[data-number="{n}"]')
        if not box.is_checked():
            box.check()
    if pick:  # drawn once every ticked trial is (the best is ticked from the start)
        pg.wait_for_function(
            "want => { const have = document.querySelector('#chart-losses').dataset.trials"
            ".split(',').map(Number); return want.every((n) => have.includes(n)); }",
            arg=pick,
            timeout=30_000,
        )
    pg.mouse.move(0, 0)  # no hover labels or mode bars on the pictures
    pg.wait_for_timeout(300)  # plotly's transitions
    for name, sel in (("timeline", "#chart-timeline"), ("losses", "#losses"),
                      ("compare", "#compare")):  # fmt: skip
        target = pg.locator(sel).locator("xpath=..") if name == "timeline" else pg.locator(sel)
        path = f"{prefix}_{name}.png"
        target.screenshot(path=path)
        sys.stdout.write(f"wrote {path}\n")


if __name__ == "__main__":
    sys.exit(main())
