"""README.md, the landing page: short, its two commands the ones CI runs, every example and every
page under docs/ named, and its ONNX op list the importer's. (The supported torch API and the IR
primitives moved to docs/porting.md and the generated docs/ops.md: tests/test_docs.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import glcomp

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

INSTALL_AND_TRAIN = "bash scripts/install.sh && glcomp train examples/digits_cnn.py"
TEST = "bash scripts/test.sh"


def bash_blocks() -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S)]


def test_readme_is_a_landing_page() -> None:
    lines = README.count("\n")
    assert lines <= 200, f"README.md has {lines} lines; move reference material into docs/"
    headings = re.findall(r"^## (.+)$", README, flags=re.M)
    for heading in ("Why", "Quick start", "Example", "What is measured", "Documentation"):
        assert heading in headings, f"README.md lacks its {heading!r} section"


def test_the_two_commands_are_the_ones_ci_runs() -> None:
    """The quick start's two commands are code blocks of their own, as given; `.ci/run` runs the
    test command, which installs through scripts/install.sh and runs lint and pytest."""
    assert bash_blocks()[:2] == [INSTALL_AND_TRAIN, TEST]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^bash scripts/test\.sh\b", ci, flags=re.M), (
        ".ci/run no longer runs the README's test command"
    )
    test_sh = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    for step in ("bash scripts/install.sh", "ruff check", "ruff format --check", "pytest"):
        assert step in test_sh, f"scripts/test.sh no longer runs {step!r}"
    assert (ROOT / "examples" / "digits_cnn.py").is_file()
    assert "glcomp = " in (ROOT / "pyproject.toml").read_text(encoding="utf-8"), "the glcomp command"


def test_examples_named_in_the_readme_exist() -> None:
    examples = set(re.findall(r"examples/[a-z_]+\.py", README))
    assert "examples/char_gpt.py" in examples
    for path in examples:
        assert (ROOT / path).is_file(), f"README names {path}, which does not exist"
    assert {f"examples/{p.name}" for p in (ROOT / "examples").glob("*.py")} <= examples, (
        "an example the README omits"
    )


def test_every_doc_is_linked() -> None:
    linked = set(re.findall(r"\]\(docs/([A-Za-z0-9_-]+\.md)", README))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"README.md links no {sorted(pages - linked)}"
    assert "docs/camera.md#the-camera-fine-tuning-demo" in README


def test_onnx_op_list_is_the_importers() -> None:
    start = README.index("<summary>ONNX ops the importer supports (glcomp.onnx.SUPPORTED_OPS)</summary>")
    ops = README[start:].split("</summary>", 1)[1].split("</details>")[0].strip().rstrip(".")
    assert sorted(op.strip() for op in ops.replace("\n", " ").split(",")) == sorted(glcomp.onnx.SUPPORTED_OPS)


def test_the_example_runs_on_the_reference_runtime() -> None:
    """The README's Python example, with the GL runtime replaced by a second reference runtime and
    fewer steps (the GL runtime is tested everywhere else), saving into a temporary directory."""
    code = re.search(r"```python\n(.*?)```", README, flags=re.S)
    assert code is not None
    source = code.group(1)
    assert 'prog.runtime("gl")' in source and "range(100)" in source
    source = source.replace('prog.runtime("gl")', 'prog.runtime("reference")').replace(
        "range(100)", "range(3)"
    )
    source = source.replace('gl.save("ckpt")', "gl.save(ckpt)")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        scope = {"ckpt": str(Path(tmp) / "ckpt"), "print": lambda *a: None}
        exec(compile(source, "README.md", "exec"), scope)  # the README's own example
        assert (Path(tmp) / "ckpt" / "manifest.json").is_file()
        assert set(scope["weights"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
