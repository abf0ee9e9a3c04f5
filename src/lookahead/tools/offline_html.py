"""HTML pages that render with no network (docs/development.md#layout).

DVC's plot pages load vega, vega-lite and vega-embed from a CDN, so offline they come out blank.
Here the three libraries are inlined from the bundle that ``vl-convert-python`` ships (no network
needed to build it), into

- the HTML template DVC fills for ``dvc plots show`` / ``dvc plots diff``: ``.dvc/config`` names
  it (``plots.html_template``, relative to ``.dvc/``) and ``make setup`` writes it with
  ``python -m lookahead.tools.offline_html .dvc/offline_plots.html``. The template has no ``{scripts}``
  placeholder, which is where DVC would put its CDN ``<script src=...>`` tags;
- :func:`page`, for any other HTML page the project writes.
"""

from __future__ import annotations

import argparse
import functools
import html
import sys

from lookahead.core.atomic import write_text

DVC_PLOTS_PLACEHOLDER = "{plot_divs}"  # what DVC replaces with one <div> + inline script per plot


@functools.cache
def vega_script() -> str:
    """A ``<script>`` element defining ``vegaEmbed``, ``vega`` and ``vegaLite`` as globals."""
    import vl_convert

    bundle = vl_convert.javascript_bundle()
    if "</script" in bundle.lower():  # would end the element early; the bundle has none today
        raise RuntimeError("the vl-convert JavaScript bundle contains '</script': cannot inline it")
    return f"<script>\n{bundle}\n</script>"


def page(title: str, body: str, head: str = "") -> str:
    """A complete self-contained page: ``body`` (HTML) after the inlined vega libraries."""
    return (
        "<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)}</title>\n{vega_script()}\n"
        "<style>body { font-family: sans-serif; } table { border-spacing: 15px; }</style>\n"
        f"{head}</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def dvc_plots_template() -> str:
    """The HTML template for ``dvc plots show``/``diff``: DVC's page with the scripts inlined."""
    return page("DVC plots (offline)", DVC_PLOTS_PLACEHOLDER, head="{refresh_tag}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the offline HTML template for `dvc plots show`.")
    parser.add_argument("out", nargs="?", default=".dvc/offline_plots.html", help="template path")
    args = parser.parse_args(argv)
    try:
        write_text(args.out, dvc_plots_template())
    except ImportError:
        print("error: vl-convert-python is not installed (run `make setup`)", file=sys.stderr)
        return 2
    print(f"offline plots template: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
