#!/usr/bin/env python3
"""scripts/lib/lang.py — the language a learner reads the kit's texts in: English, or Hindi where a Hindi file exists.

scripts/hint and scripts/quiz take `--lang hi` (or SCALELAB_LANG=hi in the environment; the option wins).
A Hindi file sits beside its English one with `.hi` before the extension: labs/03_ddp/hints.hi.md beside
hints.md, quiz.hi.json beside quiz.json, with exactly the English file's structure (tests/lint/hindi_sync.py
holds them to it; docs/translation.md). Where the Hindi file does not exist yet, the English one is read and
a one-line notice, in Hindi and English, says so. Python standard library only.
"""
import os

LANGS = ("en", "hi")
NOTICE = ("सूचना: {rel} अभी हिन्दी में नहीं है, इसलिए अंग्रेज़ी वाला दिखा रहे हैं "
          "(notice: {rel} has no Hindi version yet; showing the English one)")


def add_option(ap):
    """The --lang option of a script (argparse)."""
    ap.add_argument("--lang", choices=LANGS, default=None,
                    help="en or hi: the hints/questions in Hindi where labs/NN_name/ has the .hi file "
                         "(default: $SCALELAB_LANG, else en)")


def chosen(option):
    """The language: the --lang option, else $SCALELAB_LANG, else en. ValueError for an unknown one."""
    lang = option or os.environ.get("SCALELAB_LANG") or "en"
    if lang not in LANGS:
        raise ValueError(f"SCALELAB_LANG={lang} is not one of {', '.join(LANGS)}")
    return lang


def twin(path, lang):
    """The file of path in lang: labs/03_ddp/hints.md -> labs/03_ddp/hints.hi.md for "hi"."""
    if lang == "en":
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.{lang}{ext}"


def pick(path, lang, root):
    """(the file to read, a notice or None): path's twin in lang where it exists, else path and a notice
    naming the missing file relative to root."""
    localized = twin(path, lang)
    if localized == path or os.path.isfile(localized):
        return localized, None
    return path, NOTICE.format(rel=os.path.relpath(localized, root))
