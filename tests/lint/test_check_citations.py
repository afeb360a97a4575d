#!/usr/bin/env python3
"""test_check_citations.py — the citation lint on planted trees: it must flag a document that is not there
(the guidance documents a user's clone lacks among them) and a path into the kit's folders that does not
exist, and must not flag placeholders, URLs, files relative to the citing file, or the allowed outputs.
Run: python3 tests/lint/test_check_citations.py (ctest lint.citations_selftest)."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_citations  # noqa: E402


def make_tree(files):
    """A temp git repository holding files {relative path: text}; returns its path."""
    root = tempfile.mkdtemp(prefix="sl-citations-")
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    subprocess.run(["git", "init", "-q", root], check=True)
    subprocess.run(["git", "-C", root, "add", "-A"], check=True)
    return root


class CheckCitations(unittest.TestCase):
    def problems(self, citing_text, extra=None):
        files = {"docs/design.md": "# design\n", "docs/style.md": "# style\n", "labs/03_ddp/README.md": "# lab\n",
                 "common/src/comm/mpi.cpp": "// mpi\n", "src.cpp": citing_text}
        files.update(extra or {})
        return check_citations.check(make_tree(files))

    def test_existing_documents_and_paths_pass(self):
        self.assertEqual(self.problems("// see docs/design.md and docs/style.md 28, common/src/comm/mpi.cpp\n"), [])

    def test_guidance_documents_outside_the_repository_are_flagged(self):
        # The names are assembled here so that this file does not itself read as such a citation.
        style, refs, design = "STYLE" + ".md", "REFERENCES" + ".md", "DESIGN" + ".md"
        for cited in (style + " 28", refs + " \"Pipelines\"", design, "../" + "shared/" + design,
                      "shared/seed/LESSON.md"):
            with self.subTest(cited=cited):
                problems = self.problems(f"// as {cited} says\n")
                self.assertEqual(len(problems), 1, problems)
                self.assertIn("src.cpp:1: cites", problems[0])

    def test_a_missing_path_into_the_kit_is_flagged(self):
        problems = self.problems("// tests: tests/common/ops/test_vocab_parallel.cpp\n")
        self.assertEqual(problems, ["src.cpp:1: cites tests/common/ops/test_vocab_parallel.cpp, which is not in "
                                    "the repository"])

    def test_placeholders_urls_and_allowed_outputs_pass(self):
        text = ("// labs/NN_name/README.md, runs/<lab>/<id>/x.md, docs/{name}.md, $OUT/a.md, labs/*/README.md\n"
                "// https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md and doc/PERFORMANCE.md\n"
                "// writes scale_table.md\n")
        self.assertEqual(self.problems(text), [])

    def test_a_document_beside_the_citing_file_passes(self):
        extra = {"labs/03_ddp/notes.cpp": "// the lesson: README.md; hints.md\n", "labs/03_ddp/hints.md": "x\n"}
        self.assertEqual(self.problems("// ok\n", extra), [])

    def test_a_bare_name_passes_when_the_tree_has_that_file(self):
        self.assertEqual(self.problems("// the lab's README.md\n"), [])


if __name__ == "__main__":
    unittest.main()
