"""Values from runs (group labels, tag values, metric names, a protocol's texts) as text in a rendered table: a value
is data, never markup. Markdown: nothing a value holds can add a column, end a row, open HTML, an autolink, a link or
a code span; LaTeX: every special character as text. CSV needs no escape here (the csv module quotes)."""

from __future__ import annotations

import re

# CommonMark lets a backslash escape any ASCII punctuation. `|` splits a GFM table row (inside code spans too), a
# backtick opens a code span, `[`/`]` a link or image, `\` an escape of its own. `<` opens raw HTML or an autolink
# only before a letter, `/`, `!` or `?`, and `&` an entity only before a letter or `#`: those are escaped there alone,
# so `p < 0.05` reads as it did. Line breaks end a table row and become spaces.
_MD = re.compile(r"[\\|`\[\]]|<(?=[A-Za-z/!?])|&(?=[A-Za-z#])")


def md(value: object) -> str:
    """`value` as markdown text that renders as itself, on one line."""
    text = str(value).replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
    return _MD.sub(lambda m: "\\" + m.group(0), text)


def code(value: object) -> str:
    """`value` as a markdown code span outside a table (a heading): fenced by one more backtick than its longest run
    of backticks, padded when it starts or ends with one, on one line."""
    text = " ".join(str(value).splitlines())
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


_TEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                 "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                 "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}", "\n": " ", "\r": " "}


def tex(value: object) -> str:
    """Every LaTeX special character as text, in one pass (a backslash's replacement is not escaped again)."""
    return "".join(_TEX_SPECIALS.get(ch, ch) for ch in str(value))
