"""The documentation under docs/ against the code.

- docs/ops.md is what scripts/gen_ops_doc.py writes from the op registry and the ONNX importer, and
  lists every IR primitive and ONNX op, nothing else.
- docs/porting.md's "Supported operations" against what glcomp exports, both ways: every name it
  lists exists, and every public layer, loss, optimizer, scheduler, nn.init function, Tensor
  method, functional op and top-level function (those torch also has, plus glcomp's own exports)
  is listed.
- Every relative link in README.md and docs/*.md names a file that exists, and every #anchor a
  heading of that file.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import glcomp
from glcomp import nn, optim
from glcomp.ir.ops.registry import REGISTRY
from glcomp.ir.tensor import Tensor
from glcomp.nn import functional as F
from glcomp.nn import init
from glcomp.optim import lr_scheduler

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _gen_ops_doc():
    spec = importlib.util.spec_from_file_location("gen_ops_doc", ROOT / "scripts" / "gen_ops_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- docs/ops.md: generated from the registry -----------------------------------------------------


def test_ops_page_is_what_the_generator_writes() -> None:
    committed = (DOCS / "ops.md").read_text(encoding="utf-8")
    assert committed == _gen_ops_doc().render(), (
        "docs/ops.md does not match the op registry: run python scripts/gen_ops_doc.py"
    )


def test_ops_page_lists_every_primitive_and_onnx_op() -> None:
    text = (DOCS / "ops.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", text, flags=re.M)
    assert sorted(rows) == sorted(REGISTRY), "docs/ops.md's tables are not the registry's ops"
    assert len(rows) == len(set(rows)), "an op listed twice in docs/ops.md"
    for name, op in REGISTRY.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        assert all(f"`{a}`" in row for a in op.attrs), f"docs/ops.md: {name}'s attributes"
        if op.glsl is not None:
            assert f"`{op.glsl.replace('|', chr(92) + '|')}`" in row, f"docs/ops.md: {name}'s GLSL"
    onnx_list = text[text.index("## ONNX") :].strip().splitlines()[-1].rstrip(".")
    assert sorted(o.strip() for o in onnx_list.split(",")) == sorted(glcomp.onnx.SUPPORTED_OPS)


def test_ops_page_check_mode_agrees(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--check passes on the committed page and fails on a stale one, without writing."""
    gen = _gen_ops_doc()
    monkeypatch.setattr("sys.argv", ["gen_ops_doc.py", "--check"])
    assert gen.main() == 0
    stale = tmp_path / "ops.md"
    stale.write_text("# Supported operations\n", encoding="utf-8")
    monkeypatch.setattr(gen, "PAGE", stale)
    assert gen.main() == 1
    assert stale.read_text(encoding="utf-8") == "# Supported operations\n"


# -- docs/porting.md: the torch API glcomp has ------------------------------------------------------


def _porting() -> str:
    return (DOCS / "porting.md").read_text(encoding="utf-8")


def section() -> str:
    text = _porting()
    start = text.index("## Supported operations")
    return text[start : text.index("\n## ", start + 1)]


def bullet(label: str) -> str:
    """The text of the section's bullet that starts with `label`, after its heading (the first colon)."""
    items = re.split(r"\n- ", section())
    found = [item for item in items if item.startswith(label)]
    assert len(found) == 1, (
        f"docs/porting.md: no single bullet starts with {label!r} under 'Supported operations'"
    )
    return found[0].split(":", 1)[1]


def names(text: str) -> list[str]:
    """The identifiers quoted in `text`: each backticked span split at spaces and slashes, a
    leading dot or ``glcomp.``/``nn.`` dropped, call parentheses ignored."""
    out = []
    for span in re.findall(r"`([^`]+)`", text):
        for word in re.split(r"[\s/]+", span):
            word = word.lstrip(".").split("(")[0]
            for prefix in ("glcomp.", "nn."):
                word = word.removeprefix(prefix)
            if IDENT.match(word) and word != "None":
                out.append(word)
    return out


def classes_named(text: str) -> list[str]:
    return [n for n in names(text) if n[0].isupper()]


def test_listed_layers_losses_optimizers_and_schedulers_exist() -> None:
    layers, init_part = bullet("Layers:").split("`nn.init`:")
    for name in (
        classes_named(layers) + classes_named(bullet("Recurrent layers:")) + classes_named(bullet("Losses"))
    ):
        assert isinstance(getattr(nn, name, None), type), f"porting.md lists nn.{name}, which glcomp.nn lacks"
    for name in names(init_part.split("(drawn")[0]):
        assert callable(getattr(init, name, None)), f"porting.md lists nn.init.{name}, which glcomp lacks"
    opts, scheds = bullet("Optimizers:").split("Schedulers in")
    for name in classes_named(opts):
        assert issubclass(getattr(optim, name), optim.Optimizer), name
    for name in classes_named(scheds):
        assert issubclass(getattr(lr_scheduler, name), lr_scheduler.LRScheduler), name


def test_listed_tensor_methods_functional_and_top_level_names_exist() -> None:
    for name in names(bullet("Tensor methods").split("Comparisons return")[0]):
        assert hasattr(Tensor, name), f"porting.md lists Tensor.{name}, which glcomp.Tensor lacks"
    for name in names(bullet("`glcomp.nn.functional`")):
        assert callable(getattr(F, name, None)), (
            f"porting.md lists F.{name}, which glcomp.nn.functional lacks"
        )
    top = bullet("Top-level functions").split("The creation functions")[0]
    for name in names(top):
        assert name in glcomp.__all__ or name == "is_available", (
            f"porting.md lists glcomp.{name}, not exported"
        )
    assert "(ops.md)" in bullet("IR primitives"), "porting.md's IR primitives bullet links the generated page"


def test_every_export_is_listed() -> None:
    torch = pytest.importorskip("torch")
    seen = set(names(section()))
    missing = {
        "glcomp.nn": [n for n in nn.__all__ if n not in ("functional", "init") and n not in seen],
        "glcomp.nn.init": [  # torch's in-place initialisers (its deprecated aliases without _ aside)
            n for n in dir(init) if hasattr(torch.nn.init, n) and (n.endswith("_") or n == "calculate_gain")
            and not n.startswith("_") and n not in seen
        ],
        "glcomp.optim": [
            n for n, c in vars(optim).items() if inspect.isclass(c) and issubclass(c, optim.Optimizer)
            and c is not optim.Optimizer and n not in seen
        ],
        "glcomp.optim.lr_scheduler": [
            n for n, c in vars(lr_scheduler).items()
            if inspect.isclass(c) and issubclass(c, lr_scheduler.LRScheduler)
            and c is not lr_scheduler.LRScheduler and n not in seen
        ],
        "glcomp.Tensor": [
            n for n in dir(Tensor) if not n.startswith("_") and hasattr(torch.Tensor, n) and n not in seen
        ],
        "glcomp.nn.functional": [
            n for n in dir(F) if not n.startswith("_") and callable(getattr(F, n))
            and not isinstance(getattr(F, n), type)
            and hasattr(torch.nn.functional, n) and n not in seen
        ],
        "glcomp": [n for n in glcomp.__all__ if n not in seen],
    }  # fmt: skip
    missing = {k: v for k, v in missing.items() if v}
    assert not missing, f"docs/porting.md's 'Supported operations' does not list {missing}"


# -- links ------------------------------------------------------------------------------------------


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation but - and _ dropped,
    spaces as hyphens."""
    out = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{page.name} links {target}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name} links {target}: no such heading in {dest.name}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_cited_tests_exist(page: Path) -> None:
    """Every test a page cites (tests/x/test_y.py, tests/x/test_y.py::test_z) is where it says: the
    file exists and, when named, so does the test function."""
    text = page.read_text(encoding="utf-8")
    for path, name in re.findall(r"\b(tests/[\w/]+\.py)(?:::(\w+))?", text):
        file = ROOT / path
        assert file.is_file(), f"{page.name} cites {path}: no such file"
        if name:
            assert re.search(rf"^(?:async )?def {name}\b", file.read_text(), re.M), (
                f"{page.name} cites {path}::{name}: no such test"
            )


# -- README.md: every figure names the script that measured it, the machine and the load ----------

# A measured figure: a number with a unit of time, speed, size or a share (12.7 ms/step, 35 s, 13
# minutes, 3.5x faster, 1.26x, 96.9%, 1.72 MB, 24.4 kB, 30 steps/s, 0.48 TFLOP/s, 3,132 bytes).
FIGURE = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:-\s?\d[\d,]*(?:\.\d+)?\s?)?"
    r"(?:%|\u00d7|x(?= faster| slower|\b(?!\d))|ms\b|s\b|seconds?\b|min\b|minutes?\b|"
    r"[kKMG]i?B\b|bytes?\b|steps/s\b|[GT]FLOP/s\b)"
)
# a script of this repository that measures: benchmarks/*.py or scripts/*.sh and *.py
SCRIPT = re.compile(r"\b((?:benchmarks|scripts)/[\w./-]+\.(?:py|sh))\b")
# where it ran: a named machine, CPU, GPU or renderer, and the load it ran under
MACHINE = re.compile(r"H200|EPYC|Xeon|\d+ (?:shared )?(?:v?CPU )?cores|llvmpipe|SwiftShader|Chromium \d+")
LOAD = re.compile(r"\bload\b")
# numbers that are no measurement: versions, shapes, sizes of examples, the ONNX op list
NOT_MEASURED = re.compile(r"Python \d[\d.]*|WebGL \d|\d+x\d+|\bb\d+\b|`[^`]*`")


def _units(markdown: str) -> list[str]:
    """The paragraphs and table rows of a Markdown text, fenced code and <details> left out: a
    table row stands alone (each row names its own source), a paragraph or list item is the text
    between blank lines."""
    text = re.sub(r"```.*?```|<details>.*?</details>", "\n\n", markdown, flags=re.S)
    units = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.strip().splitlines()
        rule = [bool(re.fullmatch(r"\|[|\s:-]+", ln)) for ln in lines] + [False]
        # a row stands alone, but for the rules and the header rows above them (column names)
        units += [ln for k, ln in enumerate(lines) if ln.startswith("|") and not rule[k] and not rule[k + 1]]
        prose = "\n".join(ln for ln in lines if not ln.startswith("|")).strip()
        if prose:
            units.append(prose)
    return units


def unsourced_figures(markdown: str, root: Path = ROOT) -> list[str]:
    """What is wrong with each paragraph or table row of `markdown` that states a figure: no
    existing measuring script named, no machine, no load."""
    problems = []
    for unit in _units(markdown):
        figures = FIGURE.findall(NOT_MEASURED.sub(" ", unit))
        if not figures:
            continue
        scripts = [s for s in SCRIPT.findall(unit) if (root / s).is_file()]
        missing = [
            what
            for what, ok in (
                ("an existing script in benchmarks/ or scripts/", scripts),
                ("the machine", MACHINE.search(unit)),
                ("the load", LOAD.search(unit)),
            )
            if not ok
        ]
        if missing:
            problems.append(
                f"{' '.join(unit.split())[:160]!r} states {figures} but lacks {'; '.join(missing)}"
            )
    return problems


def test_readme_figures_name_their_script_machine_and_load() -> None:
    problems = unsourced_figures((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not problems, "README.md:\n" + "\n".join(problems)


def test_the_figure_check_catches_unsourced_figures() -> None:
    """The check itself: figures without a source are found, sourced ones and non-figures pass."""
    bad = [
        "The quick start reaches 97.2% after 15 epochs, about 35 s on 2 cores.",
        "glcomp.js is 1.3x faster than TensorFlow.js (`benchmarks/bench_browser.py`).",
        "| digits | 12.7 ms/step | `benchmarks/no_such_script.py`, llvmpipe, load 2 |",
        "A step takes 1,666 ms on an H200 with `benchmarks/realistic.py`.",
        "Each site sends 24.4 kB a round.",
        "It trains 30 steps/s.",
    ]
    for text in bad:
        assert unsourced_figures(text), f"not flagged: {text}"
    table = (
        "| what | figure |\n|---|---|\n| cnn | 296 ms |\n"
        "| mlp | `benchmarks/bench.py`: 1.1 ms, H200, load 1 |\n"
    )
    assert len(unsourced_figures(table)) == 1 and "296 ms" in unsourced_figures(table)[0]
    good = [
        "`benchmarks/realistic.py` on one NVIDIA H200, load average below 1: 177 ms per step.",
        "Python 3.11, WebGL 2, 8x8 digits, batches of 64, 15 epochs, a b64 batch.",
        "```bash\nsleep 35s\n```",
        "`glcomp train` writes `runs/digits_cnn/`; 2-5 classes from the webcam.",
    ]
    for text in good:
        assert not unsourced_figures(text), (text, unsourced_figures(text))
