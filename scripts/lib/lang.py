#!/usr/bin/env python3
"""scripts/lib/lang.py — the language a learner reads the kit's texts in: English, or Hindi where a Hindi file exists.

scripts/hint and scripts/quiz take `--lang hi` (or SCALELAB_LANG=hi in the environment; the option wins).
A Hindi file sits beside its English one with `.hi` before the extension: labs/03_ddp/hints.hi.md beside
hints.md, quiz.hi.json beside quiz.json, with exactly the English file's structure (tests/lint/hindi_sync.py
holds them to it; docs/translation.md). Where the Hindi file does not exist yet, the English one is read and
a one-line notice, in Hindi and English, says so. The words the scripts print around those texts (a quiz's
"Question 2 of 5", a hint list's header) come from FRAME below, in the language of the file shown.
Python standard library only.
"""
import os

LANGS = ("en", "hi")
NOTICE = ("सूचना: {rel} अभी हिन्दी में नहीं है, इसलिए अंग्रेज़ी वाला दिखा रहे हैं "
          "(notice: {rel} has no Hindi version yet; showing the English one)")


# The scripts' own words around a hint or a quiz, by language: key -> (English, Hindi), str.format templates
# with the same {fields} in both. The Hindi uses the glossary's terms (docs/glossary.md); commands, TODO ids
# and numbers are the fields, never translated.
FRAME = {
    # scripts/hint
    "hint.list": ("lab {lab}: hints in {path} (scripts/hint {lab}-K shows the next tier)",
                  "लैब {lab}: संकेत {path} में (`scripts/hint {lab}-K --lang hi` अगला टियर दिखाता है)"),
    "hint.not_opened": ("not opened", "खोला नहीं"),
    "hint.tier_seen": ("tier 1 seen", "टियर 1 देखा"),
    "hint.tiers_seen": ("tiers 1-{n} seen", "टियर 1-{n} देखे"),
    "hint.unknown": ("hint: no hints for {todo}; lab {lab} has {todos}",
                     "hint: {todo} के कोई संकेत नहीं हैं; लैब {lab} के TODO: {todos}"),
    "hint.forgot": ("hint: forgot the tiers shown for {what}", "hint: {what} के दिखाए टियर भुला दिए"),
    "hint.next": ("(still stuck? `scripts/hint {lab}-{k}` again shows tier {tier})",
                  "(अब भी अटके हैं? `scripts/hint {lab}-{k} --lang hi` दोबारा चलाने पर टियर (tier) {tier} दिखेगा)"),
    "hint.last": ("(that was the last tier; the lesson is in the README section the TODO names)",
                  "(यह आख़िरी टियर था; सबक README के उस सेक्शन में है जिसका नाम TODO में लिखा है)"),
    # scripts/quiz
    "quiz.header": ("Lab {number} ({title}): {n} questions, {passes} right to pass.",
                    "लैब {number} ({title}): {n} सवाल, पास होने के लिए {passes} सही।"),
    "quiz.question": ("Question {i} of {n}. {text}", "सवाल {i} ({n} में से)। {text}"),
    "quiz.no_run": ("  (cannot be graded: {why})", "  (ग्रेड नहीं हो सकता: {why})"),
    "quiz.from_run": ("  (answered from your run {where})", "  (जवाब आपके रन {where} से)"),
    "quiz.number": ("  Answer with a number.", "  जवाब एक संख्या में दीजिए।"),
    "quiz.number_in": ("  Answer with a number in {unit}.", "  जवाब एक संख्या में दीजिए, {unit} में।"),
    "quiz.answers": ("--- Answers ---", "--- जवाब ---"),
    "quiz.right": ("right", "सही"),
    "quiz.not_right": ("not right", "सही नहीं"),
    "quiz.verdict": ("{i}. {verdict} (you: {given}; answer: {answer})",
                     "{i}. {verdict} (आपका जवाब: {given}; सही जवाब: {answer})"),
    "quiz.not_graded": ("not graded: {why}", "ग्रेड नहीं हुआ: {why}"),
    "quiz.within": ("{answer} (within {within})", "{answer} ({within} की छूट के साथ)"),
    "quiz.point": ("percentage point", "प्रतिशत-अंक"),
    "quiz.points": ("percentage points", "प्रतिशत-अंक"),
    "quiz.score": ("{score} of {n} right: {result} (pass: {passes}).",
                   "{n} में से {score} सही: {result} (पास के लिए: {passes})।"),
    "quiz.passed": ("passed", "पास"),
    "quiz.not_passed": ("not passed", "पास नहीं"),
}


def say(key, language, **fields):
    """FRAME[key] in language ("en" or "hi"), its {fields} filled."""
    english, hindi = FRAME[key]
    return (hindi if language == "hi" else english).format(**fields)


def of_file(path):
    """The language a file is written in, by its name: "hi" for hints.hi.md or quiz.hi.json, else "en"."""
    return "hi" if os.path.splitext(os.path.splitext(path)[0])[1] == ".hi" else "en"


def option_text(language):
    """What a printed command adds to ask for language: " --lang hi", or "" for English."""
    return "" if language == "en" else f" --lang {language}"


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
