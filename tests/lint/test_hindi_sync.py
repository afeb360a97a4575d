#!/usr/bin/env python3
"""test_hindi_sync.py — tests/lint/hindi_sync.py catches what it must, on copies of real pages in a temp dir.

A Hindi page is made from lab 03's English README (its prose left English: the lint reads only the parts),
stamped, and then changed one part at a time: a check id, a command in a code block, an anchor, a stale
English page, a prose change (a warning only), no stamp; a hints.hi.md with a tier missing; a quiz.hi.json
with another answer. ctest lint.hindi_sync_selftest (tests/lint/CMakeLists.txt).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LINT = os.path.join(HERE, "hindi_sync.py")
LAB = os.path.join(REPO, "labs", "03_ddp")
sys.path.insert(0, HERE)
import hindi_sync  # noqa: E402  (the module under test, next to this file)


def hindi_of(en_text, en_name):
    """A page with the Hindi page's structure: the link back, and an anchor line before each heading."""
    out = [f"[English]({en_name}) · हिन्दी"]
    seen = {}
    for kind, lines in hindi_sync.blocks(en_text):
        for line in lines:
            h = hindi_sync.HEADING.match(line) if kind == "text" else None
            if h:
                out.append(f'<a id="{hindi_sync.github_anchor(h.group(2), seen)}"></a>')
            if line != f"[हिन्दी]({en_name[:-3]}.hi.md)":
                out.append(line)
    return "\n".join(out) + "\n"


def with_link(en_text, hi_name):
    """The English page with its link to the Hindi twin after the title line (as the real pages have it)."""
    lines = en_text.split("\n")
    if f"[हिन्दी]({hi_name})" in en_text:
        return en_text
    return "\n".join(lines[:1] + ["", f"[हिन्दी]({hi_name})"] + lines[1:])


class HindiSync(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.lab = os.path.join(self.tmp.name, "labs", "03_ddp")
        os.makedirs(self.lab)
        with open(os.path.join(LAB, "README.md"), encoding="utf-8") as f:
            en = with_link(f.read(), "README.hi.md")
        self.write("README.md", en)
        self.write("README.hi.md", hindi_of(en, "README.md"))
        self.lint("--stamp", os.path.join(self.lab, "README.hi.md"))

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.lab, name)

    def read(self, name):
        with open(self.path(name), encoding="utf-8") as f:
            return f.read()

    def write(self, name, text):
        with open(self.path(name), "w", encoding="utf-8") as f:
            f.write(text)

    def edit(self, name, old, new):
        text = self.read(name)
        self.assertIn(old, text)
        self.write(name, text.replace(old, new, 1))

    def lint(self, *args):
        p = subprocess.run([sys.executable, LINT] + (list(args) or ["--root", self.tmp.name]),
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout + p.stderr

    def assertFailsNaming(self, *parts):
        rc, out = self.lint()
        self.assertEqual(rc, 1, out)
        for part in parts:
            self.assertIn(part, out)

    def test_the_stamped_copy_passes(self):
        rc, out = self.lint()
        self.assertEqual(rc, 0, out)
        self.assertIn("1 Hindi files against their English twins, 0 failing", out)
        self.assertNotIn("WARNING", out)
        self.assertRegex(self.read("README.hi.md").split("\n")[1],
                         r"^<!-- hi-sync: en=README.md parts=[0-9a-f]{8}(\.[0-9a-f]{8}){3} prose=[0-9a-f]{8} -->$")

    def test_a_changed_check_id_fails_naming_it(self):
        self.edit("README.hi.md", "`lab03.bucket_layout` | 3", "`lab03.bucket_layouts` | 3")
        self.assertFailsNaming("check table #1", "`lab03.bucket_layout` 3", "`lab03.bucket_layouts` 3")

    def test_changed_points_fail(self):
        self.edit("README.hi.md", "`lab03.micro_steps_per_step` | 1 |", "`lab03.micro_steps_per_step` | 2 |")
        self.assertFailsNaming("check table #2")

    def test_a_changed_command_fails_naming_it(self):
        self.edit("README.hi.md", "scripts/run 03 --mode overlap --steps 100 ",
                  "scripts/run 03 --mode overlap --steps 10 ")
        self.assertFailsNaming("code blocks #1", "--steps 10 ")

    def test_a_changed_anchor_fails_naming_it(self):
        self.edit("README.hi.md", '<a id="start-identical"></a>', '<a id="start-identically"></a>')
        self.assertFailsNaming("anchors #", "start-identically")

    def test_a_heading_without_its_anchor_line_fails(self):
        self.edit("README.hi.md", '<a id="start-identical"></a>\n', "")
        self.assertFailsNaming("has no <a id", "anchors #")

    def test_a_task_row_moved_fails(self):
        self.edit("README.hi.md", "| `lab03-8` | `train_step` |", "| `lab03-8` | `train_steps` |")
        self.assertFailsNaming("task table #8")

    def test_an_english_change_to_a_part_makes_the_hindi_page_stale(self):
        # The same change in both pages: the parts agree, but the stamp is older than the English page.
        for name in ("README.md", "README.hi.md"):
            self.edit(name, "scripts/run 03 --mode overlap --steps 100 ", "scripts/run 03 --mode overlap --steps 200 ")
        self.assertFailsNaming("Hindi page older than its English page's last change to: code blocks")
        self.lint("--stamp", self.path("README.hi.md"))
        self.assertEqual(self.lint()[0], 0)

    def test_an_english_prose_change_is_a_warning_only(self):
        self.edit("README.md", "**Time:** about 90 minutes.", "**Time:** about two hours.")
        rc, out = self.lint()
        self.assertEqual(rc, 0, out)
        self.assertIn("WARNING labs/03_ddp/README.hi.md: Hindi page may be stale", out)

    def test_a_prose_cell_of_the_check_table_is_prose(self):
        self.edit("README.hi.md", "| the same, bucketed |", "| वही, बकेट में |")
        self.assertEqual(self.lint()[0], 0)

    def section_left_in_english(self, link):
        """The Hindi page's "Run it" section replaced by one sentence (with link, when given)."""
        text = self.read("README.hi.md")
        start = text.index('<a id="run-it"></a>')
        end = text.index("<a id=", start + 1)
        body = ('<a id="run-it"></a>\n## इसे चलाइए\n\nयह सेक्शन अंग्रेज़ी में है'
                + (f": {link}" if link else "") + "।\n\n")
        self.write("README.hi.md", text[:start] + body + text[end:])

    def test_a_section_left_in_english_by_a_link_needs_no_code_blocks(self):
        self.section_left_in_english("[README.md](README.md#run-it)")
        rc, out = self.lint()
        self.assertEqual(rc, 0, out)
        self.section_left_in_english("")  # no link: its commands are missing from the Hindi page
        self.assertFailsNaming("code blocks: the English page has")

    def test_a_link_to_a_hindi_twin_counts_as_its_english_page(self):
        self.assertEqual(hindi_sync._fixed("[x](../01_single_device/README.hi.md#one-training-step)"),
                         ["../01_single_device/README.md#one-training-step"])

    def test_no_stamp_fails(self):
        lines = self.read("README.hi.md").split("\n")
        self.write("README.hi.md", "\n".join(lines[:1] + lines[2:]))
        self.assertFailsNaming("no sync stamp on line 2")

    def test_links_both_ways_are_required(self):
        self.edit("README.md", "[हिन्दी](README.hi.md)", "")
        self.assertFailsNaming("must link to it near its top")

    def test_hints_keep_their_todos_and_tiers(self):
        with open(os.path.join(LAB, "hints.md"), encoding="utf-8") as f:
            en = with_link(f.read(), "hints.hi.md")
        self.write("hints.md", en)
        hi = f"[English](hints.md) · हिन्दी\n" + en.split("\n", 1)[1].replace("[हिन्दी](hints.hi.md)", "")
        self.write("hints.hi.md", hi)
        self.lint("--stamp", self.path("hints.hi.md"))
        rc, out = self.lint()
        self.assertEqual(rc, 0, out)
        text = self.read("hints.hi.md")
        start = text.index("## lab03-4")
        tier3 = text.index("### tier 3", start)
        self.write("hints.hi.md", text[:tier3] + re.sub(r"^### tier 3", "### tier 2", text[tier3:], count=1))
        self.assertFailsNaming("lab03-4 has a tier 2 it should not", "lab03-4: English tiers [1, 2, 3]")

    def test_a_quiz_keeps_its_answers(self):
        with open(os.path.join(LAB, "quiz.json"), encoding="utf-8") as f:
            quiz = json.load(f)
        shutil.copy(os.path.join(LAB, "quiz.json"), self.path("quiz.json"))
        quiz["questions"][0]["text"] = "हर ऑप्टिमाइज़र स्टेप में DDP क्या भेजता है?"
        self.write("quiz.hi.json", json.dumps(quiz, ensure_ascii=False))
        self.assertEqual(self.lint()[0], 0)
        quiz["questions"][1]["answer"] = "a" if quiz["questions"][1]["answer"] != "a" else "b"
        self.write("quiz.hi.json", json.dumps(quiz, ensure_ascii=False))
        self.assertFailsNaming("quiz.hi.json: question 2: \"answer\"")

    def test_a_second_part_quiz_is_checked_too(self):
        with open(os.path.join(LAB, "quiz.json"), encoding="utf-8") as f:
            quiz = json.load(f)
        shutil.copy(os.path.join(LAB, "quiz.json"), self.path("quiz.part2.json"))
        quiz["questions"][1]["answer"] = "a" if quiz["questions"][1]["answer"] != "a" else "b"
        self.write("quiz.part2.hi.json", json.dumps(quiz, ensure_ascii=False))
        self.assertFailsNaming("quiz.part2.hi.json: question 2: \"answer\"")


if __name__ == "__main__":
    unittest.main(verbosity=2)
