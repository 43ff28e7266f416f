"""DeepSeek-V3's pre-tokenizer, written for Python's `re`.

DeepSeek-V3's tokenizer.json splits text with a Sequence of three Split(Isolated) steps
and then a ByteLevel step (use_regex false):

  1. \\p{N}{1,3}
  2. [一-龥぀-ゟ゠-ヿ]+
  3. [!"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|
     ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+

Each step runs on every piece the previous step produced (a lookahead never sees past the
end of its piece); "Isolated" keeps both the matches and the unmatched text between them
as pieces. Python's `re` has no \\p{..} classes, so the classes are spelled out as code
point ranges taken from `unicodedata` (general categories: L* letters, M* marks, N*
numbers, P* punctuation, S* symbols). `re` is a backtracking engine with the same
leftmost-first alternation as Oniguruma (which Hugging Face tokenizers uses), so the
patterns below match exactly what the originals match for every character whose category
agrees between the two Unicode databases. \\s is the Unicode White_Space set that
Oniguruma uses (it includes U+0085 and not U+FEFF; JavaScript's \\s is the other way
round, and Python's own \\s adds U+001C..U+001F).
"""

import functools
import re
import sys
import unicodedata

# Unicode White_Space: what Oniguruma's \s matches for UTF-8 text.
WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
              "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")

# DeepSeek-V3's patterns, kept verbatim for tokenizer.json.
DIGITS_PATTERN = "\\p{N}{1,3}"
CJK_PATTERN = "[一-龥぀-ゟ゠-ヿ]+"
MAIN_PATTERN = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
                "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                "| ?[\\p{P}\\p{S}]+[\r\n]*"
                "|\\s*[\r\n]+"
                "|\\s+(?!\\S)"
                "|\\s+")


def _escape(cp):
    return "\\U%08x" % cp


@functools.lru_cache(maxsize=None)
def _category_class(prefix):
    """Body of a character class (no brackets) for all code points whose general
    category starts with `prefix` ("L", "M", "N", "P" or "S")."""
    ranges = []
    start = None
    for cp in range(sys.maxunicode + 2):
        inside = cp <= sys.maxunicode and unicodedata.category(chr(cp)).startswith(prefix)
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            ranges.append((start, cp - 1))
            start = None
    return "".join(_escape(a) if a == b else _escape(a) + "-" + _escape(b) for a, b in ranges)


@functools.lru_cache(maxsize=None)
def compiled_patterns():
    """The three Split patterns, translated to Python `re` syntax."""
    L, M, N, P, S = (_category_class(c) for c in "LMNPS")
    ws = "".join(_escape(ord(c)) for c in WHITESPACE)
    s, not_s = "[" + ws + "]", "[^" + ws + "]"
    digits = "[" + N + "]{1,3}"
    cjk = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
    main = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
            "|[^\r\n" + L + P + S + "]?[" + L + M + "]+"
            "| ?[" + P + S + "]+[\r\n]*"
            "|" + s + "*[\r\n]+"
            "|" + s + "+(?!" + not_s + ")"
            "|" + s + "+")
    return [re.compile(digits), re.compile(cjk), re.compile(main)]


def _split_isolated(pattern, piece):
    out = []
    pos = 0
    for m in pattern.finditer(piece):
        if m.start() > pos:
            out.append(piece[pos:m.start()])
        out.append(m.group(0))
        pos = m.end()
    if pos < len(piece):
        out.append(piece[pos:])
    return out


def pre_tokenize(text):
    """Splits `text` into the pieces DeepSeek-V3's pre-tokenizer produces (before the
    ByteLevel byte-to-character mapping)."""
    pieces = [text] if text else []
    for pattern in compiled_patterns():
        pieces = [p for piece in pieces for p in _split_isolated(pattern, piece)]
    return pieces


def bytes_to_unicode():
    """The ByteLevel alphabet: byte value -> the printable character that stands for it.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are given the code
    points 256, 257, ... in byte order, so that every token is printable text.
    """
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) +
                 list(range(ord("\xae"), ord("\xff") + 1)))
    order = list(printable)
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            order.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(order, chars)}, order
