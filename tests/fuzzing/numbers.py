"""JSON number texts at every boundary the number rule draws (``matcher.auth.strict_json``).

The rule: a number is accepted when its double is finite and, for a fraction or an
exponent form, its decimal value is exactly that double's; integers within a double's
range are kept exactly. The texts here sit on each side of every edge of that rule:
digit counts around a double's precision (15-17) and its range (308-310), exponents around
the largest and the smallest double (307-309, 323-325) and in two digits with a long
mantissa (``2`` and 210 zeros ``e99``: Infinity, found by an attacker), subnormals,
signs, trailing zeros that change nothing, and lengths past Python's integer-string limit.
"""

from __future__ import annotations

from tests.fuzzing.choosers import Chooser

_DIGIT_COUNTS = (1, 2, 15, 16, 17, 18, 19, 20, 40, 210, 300, 307, 308, 309, 310, 311, 400,
                 4300, 4301)  # fmt: skip
_FRACTION_COUNTS = (1, 2, 16, 17, 18, 40, 300, 330)
_EXPONENTS = (0, 1, 2, 22, 23, 99, 100, 290, 292, 307, 308, 309, 310, 322, 323, 324, 325,
              326, 400, 999, 99999)  # fmt: skip
_LEADING = "123456789"
_EXACT = ("0", "-0", "0.0", "-0.0", "5e-324", "-5e-324", "2.2250738585072014e-308",
          "2.225073858507201e-308", "1.7976931348623157e308", "-1.7976931348623157e+308",
          "1.7976931348623158e308", "1.7976931348623159e308", "9007199254740992",
          "9007199254740993", "18446744073709551616", "179769313486231570814527423731704356798"
          "07056752584499659891747680315726078002853876058955863276687817154045895351438246"
          "42343459437814668264638735883287730930848498524812007627148926932493138282271697"
          "61601366779453264017163282054405290024946826932669094806009434938466716305744318"
          "717632897855795936608", "2" + "0" * 210 + "e99", "1e400", "-1e400", "1e-400",
          "4.9e-324", "1.00000000000000000001", "0.1", "1E5", "1e+22", "1e23")  # fmt: skip


def _digits(c: Chooser, count: int) -> str:
    """``count`` digits: a leading nonzero digit, then nines, zeros or a mix."""
    rest = count - 1
    body = c.choice(("0" * rest, "9" * rest, ("1234567890" * (rest // 10 + 1))[:rest]))
    return c.choice(_LEADING) + body


def number_text(c: Chooser) -> str:
    """A JSON number text near an edge of the number rule (valid JSON grammar always)."""
    if c.integer(0, 3) == 0:
        return c.choice(_EXACT)
    sign = c.choice(("", "-"))
    whole = "0" if c.integer(0, 5) == 0 else _digits(c, c.choice(_DIGIT_COUNTS))
    fraction = ""
    if c.boolean():
        count = c.choice(_FRACTION_COUNTS)
        fraction = "." + c.choice(("0" * (count - 1) + "1", "9" * count, "0" * count))
    exponent = ""
    if c.boolean():
        exponent = c.choice(("e", "E")) + c.choice(("", "+", "-")) + str(c.choice(_EXPONENTS))
    return sign + whole + fraction + exponent
