"""Porting torch training code by changing imports: the same model, loss, optimizer and scheduler
code written once against torch and once against glcomp, then outputs, losses, gradients and a
few optimizer steps compared (torch in float64 on the same float32 weights).

Dropout masks cannot come from torch's generator, so the dropout tests check the masks' own
contract (keep rate, scaling, reproducibility, GL == reference bit for bit in both dialects,
identity in eval mode) and feed glcomp's mask to torch to compare the training that uses it.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import GlcompError, nn, optim
from glcomp.nn import functional as F
from glcomp.optim import lr_scheduler

torch = pytest.importorskip("torch")

RTOL, ATOL = 2e-4, 1e-5
TORCH = SimpleNamespace(nn=torch.nn, F=torch.nn.functional, optim=torch.optim, lib=torch)
GLCOMP = SimpleNamespace(nn=nn, F=F, optim=optim, lib=glcomp)


def pair(build: Any) -> tuple[Any, Any]:
    """The torch model (float64) and the glcomp model holding the same weights."""
    torch.manual_seed(0)
    tmodel = build(TORCH)
    gmodel = build(GLCOMP)
    state = {k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
    assert list(state) == list(gmodel.state_dict()), "state_dict names or order differ from torch"
    gmodel.load_state_dict(state)
    return tmodel.double(), gmodel


def close(got: Any, want: Any, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    assert np.shape(got) == want.shape, what
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def check_grads(rt: Any, tmodel: Any, feeds: dict[str, Any]) -> None:
    grads = rt.gradients(**feeds)
    assert sorted(grads) == sorted(k for k, _ in tmodel.named_parameters())
    for k, p in tmodel.named_parameters():
        close(grads[k], p.grad, f"gradient of {k}")


# -- 1. dropout ------------------------------------------------------------------------------------
class Probe(nn.Module):
    """forward(h) = dropout(h) in train mode whatever the module mode (functional default)."""

    def __init__(self, p: float, kind: str = "dropout") -> None:
        super().__init__()
        self.p, self.kind = p, kind

    def forward(self, h: Any) -> Any:
        return getattr(F, self.kind)(h, self.p)


def mask_of(shape: tuple[int, ...], p: float, step: int = 0, kind: str = "dropout", **kw: Any) -> np.ndarray:
    """What the first random call of a trace multiplies by at `step` (0 or 1 / (1 - p))."""
    prog = glcomp.compile(Probe(p, kind), {"h": shape}, **kw)
    rt = prog.runtime("reference")
    rt.load_state_dict(rt.state_dict(), optimizer={"rng.step": np.float32(step)})
    return rt.predict(h=np.ones(shape, np.float32))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_keep_rate_and_scale(p: float) -> None:
    mask = mask_of((100, 200), p)
    kept = mask != 0
    np.testing.assert_allclose(mask[kept], 1.0 / (1.0 - p), rtol=1e-6)
    assert abs(kept.mean() - (1 - p)) < 0.015, kept.mean()
    # No structure along rows or columns: every row and column keeps about 1 - p.
    assert np.abs(kept.mean(1) - (1 - p)).max() < 0.15
    assert np.abs(kept.mean(0) - (1 - p)).max() < 0.2
    # Neighbouring elements are independent: P(both kept) ~ (1 - p)^2.
    assert abs((kept[:, 1:] & kept[:, :-1]).mean() - (1 - p) ** 2) < 0.015


def test_dropout_masks_are_reproducible_and_change_per_step_and_call() -> None:
    glcomp.manual_seed(3)
    a0, a1 = mask_of((40, 50), 0.5, 0), mask_of((40, 50), 0.5, 1)
    glcomp.manual_seed(3)
    assert np.array_equal(mask_of((40, 50), 0.5, 0), a0), "same seed and step: same mask"
    assert 0.4 < (a0 == a1).mean() < 0.6, "the next step draws an independent mask"
    glcomp.manual_seed(4)
    assert 0.4 < (mask_of((40, 50), 0.5, 0) == a0).mean() < 0.6, "another seed, another mask"

    class Two(nn.Module):
        def forward(self, h: Any) -> Any:
            return F.dropout(h, 0.5), F.dropout(h, 0.5)

    out = glcomp.compile(Two(), {"h": (40, 50)}).runtime("reference").predict(h=np.ones((40, 50)))
    assert 0.4 < (out["output.0"] == out["output.1"]).mean() < 0.6, "each call has a seed of its own"


def test_dropout2d_drops_whole_channels() -> None:
    mask = mask_of((30, 20, 3, 2), 0.3, kind="dropout2d")
    per_channel = mask.reshape(30, 20, -1)
    assert np.all(per_channel == per_channel[..., :1])
    assert abs((per_channel[..., 0] != 0).mean() - 0.7) < 0.06
    with pytest.raises(GlcompError, match="dropout2d expects input of rank 3 or 4"):
        glcomp.compile(Probe(0.3, "dropout2d"), {"h": (20,)})  # 2-D drops elements, as torch
    with pytest.raises(GlcompError, match="between 0 and 1"):
        nn.Dropout(1.5)


def test_dropout_masks_gl_equal_reference(gl_runtime: Any, dialect: str) -> None:
    shape = (37, 29)
    prog = glcomp.compile(Probe(0.4), {"h": shape}, target=dialect)
    h = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for step in (0, 1, 12345):
            for rt in (ref, gl):
                rt.load_state_dict(rt.state_dict(), optimizer={"rng.step": np.float32(step)})
            got, want = gl.predict(h=h), ref.predict(h=h)
            assert np.array_equal(got != 0, want != 0), f"masks differ at step {step}"
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def dropout_mlp(ns: Any, p: float = 0.5) -> Any:
    return ns.nn.Sequential(ns.nn.Linear(6, 16), ns.nn.ReLU(), ns.nn.Dropout(p), ns.nn.Linear(16, 3))


def test_dropout_train_and_eval_like_torch() -> None:
    """predict is eval mode (identity); gradients and train_step use the mask of the current
    step, and each train step advances it: three SGD steps follow torch fed the same masks."""
    tmodel, gmodel = pair(dropout_mlp)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 6)), rng.integers(0, 3, size=8)
    tx, ty = torch.tensor(x), torch.tensor(y)
    prog = glcomp.compile(gmodel, {"x": x.shape}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.5))
    rt = prog.runtime("reference")
    tmodel.eval()
    close(rt.predict(x=x), tmodel(tx), "eval mode: dropout is the identity")

    topt = torch.optim.SGD(tmodel.parameters(), lr=0.5)
    for step in range(3):
        mask = torch.tensor(mask_of((8, 16), 0.5, step).astype(np.float64))
        hidden = torch.relu(tmodel[0](tx)) * mask
        tloss = torch.nn.functional.cross_entropy(tmodel[3](hidden), ty)
        topt.zero_grad()
        tloss.backward()
        if step == 0:
            check_grads(rt, tmodel, {"x": x, "y": y})
        assert rt.train_step(x=x, y=y) == pytest.approx(tloss.item(), rel=RTOL), f"step {step}"
        topt.step()
    assert rt.optimizer_state()["rng.step"] == 3
    for k, v in tmodel.state_dict().items():
        close(rt.state_dict()[k], v, k)


def test_dropout_training_gl_equals_reference(gl_runtime: Any) -> None:
    glcomp.manual_seed(1)
    model = dropout_mlp(GLCOMP, 0.3)
    prog = glcomp.compile(model, {"x": (8, 6)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=0.01))
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(8, 6)).astype(np.float32), rng.integers(0, 3, size=8)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for step in range(3):
            assert gl.train_step(x=x, y=y) == pytest.approx(ref.train_step(x=x, y=y), rel=RTOL), step
        for k, v in ref.state_dict().items():
            close(gl.state_dict()[k], v, k)
        assert gl.optimizer_state()["rng.step"] == 3


# -- 2. the forward / loss contract ----------------------------------------------------------------
def mlp(ns: Any) -> Any:
    return ns.nn.Sequential(ns.nn.Linear(5, 8), ns.nn.Tanh(), ns.nn.Linear(8, 3))


@pytest.mark.parametrize("which", ["cross_entropy", "nll_loss", "user_mse"])
def test_loss_given_as_a_function(which: str) -> None:
    tmodel, gmodel = pair(mlp)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 5))
    if which == "user_mse":
        y = rng.normal(size=(6, 3))

        def loss(out: Any, target: Any) -> Any:
            return ((out - target) ** 2).sum(1).mean()

        gloss = tloss_fn = loss
    else:
        y = rng.integers(0, 3, size=6)
        if which == "nll_loss":

            def gloss(out: Any, target: Any) -> Any:
                return F.nll_loss(F.log_softmax(out, 1), target)

            def tloss_fn(out: Any, target: Any) -> Any:
                return torch.nn.functional.nll_loss(torch.log_softmax(out, 1), target)
        else:
            gloss, tloss_fn = F.cross_entropy, torch.nn.functional.cross_entropy
    prog = glcomp.compile(gmodel, {"x": x.shape}, loss=gloss, target_spec=None if which != "nll_loss" else
                          {"shape": (6,), "dtype": "int32", "num_classes": 3})  # fmt: skip
    assert prog.target.dtype == ("float32" if which == "user_mse" else "int32")
    tloss = tloss_fn(tmodel(torch.tensor(x)), torch.tensor(y))
    tloss.backward()
    check_grads(prog.runtime("reference"), tmodel, {"x": x, "y": y})


def test_forward_returning_a_tuple_takes_the_loss_on_the_first() -> None:
    def build(ns: Any) -> Any:
        class TwoHeads(ns.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.body = mlp(ns)

            def forward(self, x: Any) -> Any:
                out = self.body(x)
                return out, out.sigmoid()

        return TwoHeads()

    tmodel, gmodel = pair(build)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(4, 5)), rng.integers(0, 3, size=4)
    prog = glcomp.compile(gmodel, {"x": x.shape}, loss=nn.CrossEntropyLoss())
    rt = prog.runtime("reference")
    out = rt.predict(x=x)
    tout = tmodel(torch.tensor(x))
    close(out["output.0"], tout[0], "first output")
    close(out["output.1"], tout[1], "second output")
    torch.nn.functional.cross_entropy(tout[0], torch.tensor(y)).backward()
    check_grads(rt, tmodel, {"x": x, "y": y})


def gpt(ns: Any, p_drop: float = 0.0, vocab: int = 7, block: int = 4, embd: int = 8, heads: int = 2) -> Any:
    """minGPT's model, nearly verbatim (one block): ModuleDict, ModuleList, Embedding, LayerNorm,
    GELU, split, view(-1), transpose, batched @, masked_fill with a tril buffer, dropout, and the
    loss computed in forward(idx, targets)."""
    tnn, fn, lib = ns.nn, ns.F, ns.lib

    class CausalSelfAttention(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c_attn = tnn.Linear(embd, 3 * embd)
            self.c_proj = tnn.Linear(embd, embd)
            self.attn_dropout = tnn.Dropout(p_drop)
            self.resid_dropout = tnn.Dropout(p_drop)
            self.register_buffer("bias", lib.tril(lib.ones(block, block)).reshape(1, 1, block, block))
            self.n_head, self.n_embd = heads, embd

        def forward(self, x: Any) -> Any:
            B, T, C = x.size()  # noqa: N806
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = fn.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.resid_dropout(self.c_proj(y))

    class Block(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = tnn.LayerNorm(embd)
            self.attn = CausalSelfAttention()
            self.ln_2 = tnn.LayerNorm(embd)
            self.mlp = tnn.ModuleDict(
                dict(
                    c_fc=tnn.Linear(embd, 4 * embd),
                    c_proj=tnn.Linear(4 * embd, embd),
                    act=tnn.GELU(),
                    dropout=tnn.Dropout(p_drop),
                )
            )

        def forward(self, x: Any) -> Any:
            m = self.mlp
            x = x + self.attn(self.ln_1(x))
            return x + m.dropout(m.c_proj(m.act(m.c_fc(self.ln_2(x)))))

    class GPT(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = tnn.ModuleDict(
                dict(
                    wte=tnn.Embedding(vocab, embd),
                    wpe=tnn.Embedding(block, embd),
                    drop=tnn.Dropout(p_drop),
                    h=tnn.ModuleList([Block() for _ in range(1)]),
                    ln_f=tnn.LayerNorm(embd),
                )
            )
            self.lm_head = tnn.Linear(embd, vocab, bias=False)

        def forward(self, idx: Any, targets: Any = None) -> Any:
            device = lib.device("cpu")
            _, t = idx.size()
            pos = lib.arange(0, t, dtype=lib.long, device=device).unsqueeze(0)
            tok_emb = self.transformer.wte(idx)
            pos_emb = self.transformer.wpe(pos)
            x = self.transformer.drop(tok_emb + pos_emb)
            for blk in self.transformer.h:
                x = blk(x)
            x = self.transformer.ln_f(x)
            logits = self.lm_head(x)
            loss = None
            if targets is not None:
                loss = fn.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
            return logits, loss

    return GPT().to(lib.device("cpu"))


GPT_SPEC = {"shape": (2, 4), "dtype": "int32", "num_classes": 7}


def test_mingpt_loss_in_forward_like_torch() -> None:
    tmodel, gmodel = pair(gpt)
    rng = np.random.default_rng(3)
    idx, targets = rng.integers(0, 7, size=(2, 4)), rng.integers(0, 7, size=(2, 4))
    prog = glcomp.compile(
        gmodel, {"idx": idx.shape}, loss="forward", optimizer=optim.AdamW(lr=0.01),
        target_name="targets", target_spec=GPT_SPEC,
    )  # fmt: skip
    rt = prog.runtime("reference")
    tmodel.eval()
    tlogits, _ = tmodel(torch.tensor(idx))
    close(rt.predict(idx=idx), tlogits, "predict returns the logits (the None loss is dropped)")
    tmodel.train()
    topt = torch.optim.AdamW(tmodel.parameters(), lr=0.01)
    for step in range(3):
        topt.zero_grad()
        _, tloss = tmodel(torch.tensor(idx), torch.tensor(targets))
        tloss.backward()
        if step == 0:
            check_grads(rt, tmodel, {"idx": idx, "targets": targets})
        assert rt.train_step(idx=idx, targets=targets) == pytest.approx(tloss.item(), rel=RTOL), step
        topt.step()
    # The key bias has an exactly zero gradient (softmax ignores a shift shared by a row), so its
    # gradient is rounding noise that AdamW turns into lr-sized steps of either sign.
    key_bias = slice(8, 16)
    for k, v in tmodel.state_dict().items():
        got, want = rt.state_dict()[k], v.detach().numpy()
        if k.endswith("c_attn.bias"):
            got, want = np.delete(got, key_bias), np.delete(want, key_bias)
        close(got, want, k, rtol=1e-3, atol=1e-5)


def test_mingpt_with_dropout_on_gl_like_reference(gl_runtime: Any) -> None:
    """The whole minGPT graph in shaders: embeddings, layer norms, erf GELU, causal masking with
    -inf, batched products and dropout masks (train mode) match the reference runtime."""
    glcomp.manual_seed(5)
    prog = glcomp.compile(
        gpt(GLCOMP, p_drop=0.2), {"idx": (1, 4)}, loss="forward",
        target_name="targets", target_spec=GPT_SPEC | {"shape": (1, 4)},
    )  # fmt: skip
    rng = np.random.default_rng(4)
    idx, targets = rng.integers(0, 7, size=(1, 4)), rng.integers(0, 7, size=(1, 4))
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        close(gl.predict(idx=idx), ref.predict(idx=idx), "predict")
        got, want = gl.gradients(idx=idx, targets=targets), ref.gradients(idx=idx, targets=targets)
        for k, v in want.items():
            close(got[k], v, f"gradient of {k}", atol=1e-5)


def test_loss_contract_errors() -> None:
    with pytest.raises(GlcompError, match='loss="forward" needs target_spec='):
        glcomp.compile(gpt(GLCOMP), {"idx": (2, 4)}, loss="forward", target_name="targets")
    with pytest.raises(GlcompError, match=r"loss must be a glcomp\.nn loss module"):
        glcomp.compile(mlp(GLCOMP), {"x": (2, 5)}, loss=lambda out: out.sum())
    with pytest.raises(GlcompError, match="integer targets need num_classes"):
        glcomp.compile(
            mlp(GLCOMP), {"x": (2, 5)}, loss=F.cross_entropy, target_spec={"shape": (2,), "dtype": "int32"}
        )


# -- 3. losses ----------------------------------------------------------------------------------------
LOSSES = [
    ("NLLLoss", {}, "labels"),
    ("NLLLoss", {"ignore_index": 1}, "labels"),
    ("CrossEntropyLoss", {"label_smoothing": 0.1}, "labels"),
    ("CrossEntropyLoss", {"ignore_index": 2, "reduction": "sum"}, "labels"),
    ("BCELoss", {}, "probs"),
    ("BCEWithLogitsLoss", {}, "probs"),
    ("BCEWithLogitsLoss", {"pos_weight": 2.5}, "probs"),
    ("L1Loss", {}, "real"),
    ("SmoothL1Loss", {"beta": 0.5}, "real"),
    ("HuberLoss", {"delta": 0.7}, "real"),
    ("KLDivLoss", {"reduction": "batchmean"}, "probs"),
    ("KLDivLoss", {"reduction": "sum", "log_target": True}, "real"),
    ("MSELoss", {"reduction": "sum"}, "real"),
]


@pytest.mark.parametrize(("name", "kwargs", "kind"), LOSSES, ids=[f"{n}-{k}" for n, k, _ in LOSSES])
def test_loss_modules_like_torch(name: str, kwargs: dict[str, Any], kind: str) -> None:
    def build(ns: Any) -> Any:
        head: list[Any] = []
        if name == "NLLLoss":
            head = [ns.nn.LogSoftmax(dim=1)]
        elif name == "BCELoss":
            head = [ns.nn.Sigmoid()]
        elif name == "KLDivLoss":
            head = [ns.nn.LogSoftmax(dim=1)]
        return ns.nn.Sequential(ns.nn.Linear(5, 4), *head)

    tmodel, gmodel = pair(build)
    rng = np.random.default_rng(6)
    x = rng.normal(size=(6, 5))
    if kind == "labels":
        y = rng.integers(0, 4, size=6)
    elif kind == "probs":
        y = rng.dirichlet(np.ones(4), size=6) if name == "KLDivLoss" else rng.uniform(size=(6, 4))
        if name == "KLDivLoss":
            y[0, 1] = 0.0  # target zeros contribute 0, as torch's xlogy
    else:
        y = rng.normal(size=(6, 4))
    tkw = dict(kwargs)
    if "pos_weight" in tkw:
        tkw["pos_weight"] = torch.tensor(tkw["pos_weight"], dtype=torch.float64)
    tloss = getattr(torch.nn, name)(**tkw)(tmodel(torch.tensor(x)), torch.tensor(y))
    tloss.backward()
    prog = glcomp.compile(
        gmodel, {"x": x.shape}, loss=getattr(nn, name)(**kwargs), optimizer=optim.SGD(lr=0.0)
    )
    rt = prog.runtime("reference")
    check_grads(rt, tmodel, {"x": x, "y": y})
    assert rt.train_step(x=x, y=y) == pytest.approx(tloss.item(), rel=RTOL, abs=ATOL)


def test_functional_losses_reduction_none() -> None:
    rng = np.random.default_rng(7)
    z, t, labels = rng.normal(size=(5, 3)), rng.uniform(size=(5, 3)), rng.integers(0, 3, size=5)

    class Losses(nn.Module):
        def forward(self, z: Any, t: Any, y: Any) -> Any:
            return (
                F.l1_loss(z, t, reduction="none"),
                F.smooth_l1_loss(z, t, reduction="none"),
                F.binary_cross_entropy_with_logits(z, t, reduction="none"),
                F.binary_cross_entropy(z.sigmoid(), t, reduction="none"),
                F.nll_loss(F.log_softmax(z, 1), y, reduction="none"),
                F.cross_entropy(z, y, reduction="none"),
                F.kl_div(F.log_softmax(z, 1), t, reduction="none"),
            )

    got = (
        glcomp.compile(Losses(), {"z": z.shape, "t": t.shape, "y": (5,)})
        .runtime("reference")
        .predict(z=z, t=t, y=labels)
    )
    tz, tt, ty, tf = torch.tensor(z), torch.tensor(t), torch.tensor(labels), torch.nn.functional
    want = [
        tf.l1_loss(tz, tt, reduction="none"),
        tf.smooth_l1_loss(tz, tt, reduction="none"),
        tf.binary_cross_entropy_with_logits(tz, tt, reduction="none"),
        tf.binary_cross_entropy(tz.sigmoid(), tt, reduction="none"),
        tf.nll_loss(tz.log_softmax(1), ty, reduction="none"),
        tf.cross_entropy(tz, ty, reduction="none"),
        tf.kl_div(tz.log_softmax(1), tt, reduction="none"),
    ]
    for i, w in enumerate(want):
        close(got[f"output.{i}"], w, f"loss {i}")


# -- 4. optimizers and schedulers -------------------------------------------------------------------
OPTIMIZERS = [
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 0.01}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True, "weight_decay": 0.01}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1, "weight_decay": 0.01}),
    ("Adadelta", {"lr": 1.0, "rho": 0.8, "weight_decay": 0.01}),
]


@pytest.mark.parametrize(
    ("name", "kwargs"), OPTIMIZERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPTIMIZERS)]
)
def test_optimizers_like_torch(name: str, kwargs: dict[str, Any]) -> None:
    tmodel, gmodel = pair(mlp)
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(6, 5)), rng.integers(0, 3, size=6)
    rt = glcomp.compile(
        gmodel, {"x": x.shape}, loss=F.cross_entropy, optimizer=getattr(optim, name)(**kwargs)
    )
    rt = rt.runtime("reference")
    topt = getattr(torch.optim, name)(tmodel.parameters(), **kwargs)
    for step in range(4):
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(y))
        tloss.backward()
        topt.step()
        assert rt.train_step(x=x, y=y) == pytest.approx(tloss.item(), rel=RTOL), f"step {step}"
    for k, v in tmodel.state_dict().items():
        close(rt.state_dict()[k], v, k, rtol=1e-3, atol=1e-5)


def test_new_optimizers_on_gl(gl_runtime: Any) -> None:
    glcomp.manual_seed(2)
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=(6, 5)).astype(np.float32), rng.integers(0, 3, size=6)
    for name, kwargs in OPTIMIZERS[1:2] + OPTIMIZERS[3:]:
        prog = glcomp.compile(
            mlp(GLCOMP), {"x": x.shape}, loss=nn.CrossEntropyLoss(), optimizer=getattr(optim, name)(**kwargs)
        )
        ref = prog.runtime("reference")
        with gl_runtime(prog) as gl:
            for _ in range(3):
                assert gl.train_step(x=x, y=y) == pytest.approx(ref.train_step(x=x, y=y), rel=RTOL), name
            for k, v in ref.state_dict().items():
                close(gl.state_dict()[k], v, f"{name} {k}", rtol=1e-3, atol=1e-5)


SCHEDULERS = [
    ("StepLR", {"step_size": 3, "gamma": 0.5}),
    ("MultiStepLR", {"milestones": [2, 5], "gamma": 0.3}),
    ("ExponentialLR", {"gamma": 0.9}),
    ("CosineAnnealingLR", {"T_max": 5, "eta_min": 0.001}),
    ("OneCycleLR", {"max_lr": 0.5, "total_steps": 12, "cycle_momentum": False}),
    (
        "OneCycleLR",
        {
            "max_lr": 0.5,
            "epochs": 3,
            "steps_per_epoch": 4,
            "anneal_strategy": "linear",
            "three_phase": True,
            "cycle_momentum": False,
        },
    ),
]


@pytest.mark.parametrize(
    ("name", "kwargs"), SCHEDULERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SCHEDULERS)]
)
def test_lr_schedulers_like_torch(name: str, kwargs: dict[str, Any]) -> None:
    tmodel, gmodel = pair(mlp)
    rt = glcomp.compile(
        gmodel, {"x": (6, 5)}, loss=F.cross_entropy, optimizer=optim.SGD(lr=0.1, momentum=0.9)
    )
    rt = rt.runtime("reference")
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.1, momentum=0.9)
    tsched = getattr(torch.optim.lr_scheduler, name)(topt, **kwargs)
    gsched = getattr(lr_scheduler, name)(rt, **kwargs)
    rng = np.random.default_rng(10)
    x, y = rng.normal(size=(6, 5)), rng.integers(0, 3, size=6)
    for step in range(11):
        assert rt.lr == pytest.approx(topt.param_groups[0]["lr"], rel=1e-9), f"lr at step {step}"
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(y))
        tloss.backward()
        topt.step()
        tsched.step()
        assert rt.train_step(x=x, y=y) == pytest.approx(tloss.item(), rel=RTOL), f"step {step}"
        gsched.step()
        assert gsched.get_last_lr() == pytest.approx(tsched.get_last_lr(), rel=1e-9)


# -- 5 and 6. spellings, layers and ops ---------------------------------------------------------------
def zoo(ns: Any) -> Any:
    """Layers and tensor ops that ported scripts use, in one model."""
    tnn, fn, lib = ns.nn, ns.F, ns.lib

    class Zoo(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = tnn.ModuleList([tnn.Linear(6, 12), tnn.Linear(4, 4), tnn.Linear(12, 3)])
            self.acts = tnn.ModuleDict(
                {
                    "gelu": tnn.GELU(),
                    "tanh_gelu": tnn.GELU(approximate="tanh"),
                    "silu": tnn.SiLU(),
                    "elu": tnn.ELU(0.7),
                    "softplus": tnn.Softplus(2.0),
                }
            )
            self.norm = tnn.LayerNorm(12)
            self.flat = tnn.Flatten()

        def forward(self, x: Any) -> Any:
            h = self.norm(self.layers[0](x.view(-1, 6)))
            a, b, c = h.chunk(3, dim=1)
            parts = [self.acts["gelu"](a * 3), self.acts["tanh_gelu"](b * 3), self.acts["silu"](c)]
            h = lib.cat(parts, dim=1)
            h = self.acts["elu"](h) + self.acts["softplus"](h) * 0.5
            h = h.clamp(min=-0.5, max=1.5) + h.abs().pow(3) * 0.1 - (h * h + 1).pow(-1) + (h * h + 1) ** 0.5
            h = h.masked_fill(h > 1.2, 0.25)
            u, v = h.split([4, 8], dim=1)
            g = self.layers[1](u)
            first = g.view(2, 2, 4) @ v.contiguous().view(2, 4, 4)  # (2, 2, 4) @ (2, 4, 4)
            second = v.reshape(2, 2, 8) @ v.reshape(2, 8, 2)
            hb = lib.cat([first.reshape(4, 4), second.reshape(4, 2), h[:, 4:10]], dim=1)
            out = self.layers[2](hb.view(x.size(0), -1))
            return (
                fn.log_softmax(out, dim=-1)
                + lib.tanh(out).sum(1, keepdim=True) * 0.1
                + lib.sigmoid(lib.flatten(out)).view(4, 3) * x.numel() / 1000.0
            )

    return Zoo()


def test_zoo_of_ops_like_torch(gl_runtime: Any) -> None:
    tmodel, gmodel = pair(zoo)
    rng = np.random.default_rng(11)
    x, y = rng.normal(size=(4, 6)), rng.integers(0, 3, size=4)
    gmodel.train()
    tmodel.train()
    prog = glcomp.compile(gmodel, {"x": x.shape}, loss=nn.NLLLoss())
    rt = prog.runtime("reference")
    tout = tmodel(torch.tensor(x))
    close(rt.predict(x=x), tout, "output")
    torch.nn.functional.nll_loss(tout, torch.tensor(y)).backward()
    check_grads(rt, tmodel, {"x": x, "y": y})
    with gl_runtime(prog) as gl:
        close(gl.predict(x=x), tout, "GL output")
        check_grads(gl, tmodel, {"x": x, "y": y})


def test_erf_gelu_is_float32_accurate() -> None:
    x = np.linspace(-8, 8, 4001)

    class Act(nn.Module):
        def forward(self, x: Any) -> Any:
            return F.gelu(x), F.erf(x)

    got = glcomp.compile(Act(), {"x": x.shape}).runtime("reference", dtype=np.float64).predict(x=x)
    tx = torch.tensor(x)
    close(got["output.0"], torch.nn.functional.gelu(tx), "gelu", rtol=1e-6, atol=3e-7)
    close(got["output.1"], torch.erf(tx), "erf", rtol=0, atol=3e-7)


def test_embedding_and_init_like_torch() -> None:
    def build(ns: Any) -> Any:
        model = ns.nn.Sequential(ns.nn.Embedding(9, 4, padding_idx=0), ns.nn.Flatten(), ns.nn.Linear(12, 2))
        return model

    tmodel, gmodel = pair(build)
    rng = np.random.default_rng(12)
    ids, y = rng.integers(0, 9, size=(5, 3)), rng.normal(size=(5, 2))
    ids[0, 0] = 0
    prog = glcomp.compile(gmodel, {"x": ids.shape}, loss=nn.MSELoss())
    torch.nn.functional.mse_loss(tmodel(torch.tensor(ids)), torch.tensor(y)).backward()
    check_grads(prog.runtime("reference"), tmodel, {"x": ids, "y": y})

    glcomp.manual_seed(0)
    w = nn.Parameter(np.zeros((64, 32, 3, 3), np.float32))
    bound = math.sqrt(6.0 / (32 * 9))  # kaiming_uniform_, relu gain, fan_in
    nn.init.kaiming_uniform_(w, nonlinearity="relu")
    assert np.abs(w.data).max() <= bound and np.abs(w.data).max() > 0.98 * bound
    nn.init.xavier_normal_(w, gain=2.0)
    assert w.data.std() == pytest.approx(2.0 * math.sqrt(2.0 / (32 * 9 + 64 * 9)), rel=0.03)
    nn.init.kaiming_normal_(w, mode="fan_out")
    assert w.data.std() == pytest.approx(math.sqrt(2.0 / (1 + 0.0)) / math.sqrt(64 * 9), rel=0.03)
    nn.init.zeros_(w)
    assert not w.data.any()


def test_script_spellings() -> None:
    device = glcomp.device("cuda" if glcomp.cuda.is_available() else "cpu")
    model = mlp(GLCOMP).to(device).cuda().cpu().float()
    model.eval()
    assert not model.training and model.train().training is not False
    assert sum(p.numel() for p in model.parameters()) == 5 * 8 + 8 + 8 * 3 + 3
    assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    mask = glcomp.tril(glcomp.ones(3, 3))
    assert isinstance(mask, np.ndarray) and mask.sum() == 6
    assert glcomp.arange(1, 4).tolist() == [1.0, 2.0, 3.0]

    class Consts(nn.Module):
        def forward(self, x: Any) -> Any:
            z = glcomp.zeros(3, 4) + glcomp.ones_like(x) + glcomp.full((3, 4), 2.0) + glcomp.zeros_like(x)
            t = glcomp.tril(x, diagonal=1) + glcomp.triu(x) * 10
            return z + t + glcomp.arange(4) + glcomp.exp(glcomp.log(glcomp.relu(x) + 1)) + x.dim() + x.size(1)

    x = np.arange(12, dtype=np.float64).reshape(3, 4) - 5
    got = glcomp.compile(Consts(), {"x": (3, 4)}).runtime("reference").predict(x=x)
    want = 3 + np.tril(x, 1) + np.triu(x) * 10 + np.arange(4) + np.maximum(x, 0) + 1 + 2 + 4
    np.testing.assert_allclose(got, want, rtol=1e-6)
    with glcomp.no_grad():
        pass


def test_more_tensor_ops_like_torch() -> None:
    def build(ns: Any) -> Any:
        tnn, fn = ns.nn, ns.F

        class More(tnn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc = tnn.Linear(6, 6)
                self.acts = tnn.Sequential(tnn.Mish(), tnn.Hardswish(), tnn.ReLU6(), tnn.Hardtanh(-0.5, 2.0))
                self.unflatten = tnn.Unflatten(1, (2, 3))

            def forward(self, x: Any) -> Any:
                h = self.fc(x)
                a, b = self.unflatten(h).unbind(1)  # (4, 3) each
                r = a.repeat(2, 3)  # (8, 9)
                v = h.var(1, keepdim=True) + h.std(0, unbiased=False).sum() + h.var()
                s = (
                    (h.sign() * h).rsqrt() * 0.1
                    + fn.normalize(h, dim=1)
                    + fn.pad(b, (1, 2)).sum(1, keepdim=True)
                )
                return self.acts(h * 3) + v + s + r[:4, :6] + r[4:, 3:].tanh()

        return More()

    tmodel, gmodel = pair(build)
    x = np.random.default_rng(13).normal(size=(4, 6))
    prog = glcomp.compile(gmodel, {"x": x.shape}, loss=nn.MSELoss())
    y = np.zeros((4, 6))
    tout = tmodel(torch.tensor(x))
    close(prog.runtime("reference").predict(x=x), tout, "output")
    torch.nn.functional.mse_loss(tout, torch.tensor(y)).backward()
    check_grads(prog.runtime("reference"), tmodel, {"x": x, "y": y})


def test_lambda_scheduler_and_dropout1d() -> None:
    rt = glcomp.compile(mlp(GLCOMP), {"x": (2, 5)}, loss=F.cross_entropy, optimizer=optim.SGD(lr=0.2))
    rt = rt.runtime("reference")
    sched = lr_scheduler.LambdaLR(rt, lambda epoch: 1.0 / (epoch + 1))
    for epoch in range(4):
        assert rt.lr == pytest.approx(0.2 / (epoch + 1))
        sched.step()
    mask = mask_of((40, 30, 5), 0.5, kind="dropout1d")
    assert np.all(mask == mask[..., :1]) and 0.4 < (mask[..., 0] != 0).mean() < 0.6


def test_attention_and_none_indexing_like_torch() -> None:
    def build(ns: Any) -> Any:
        tnn, fn = ns.nn, ns.F

        class Attention(tnn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.qkv = tnn.Linear(4, 12)

            def forward(self, x: Any, mask: Any) -> Any:
                q, k, v = self.qkv(x).view(2, 3, 3, 4).transpose(1, 2).unbind(1)  # (2, 3, 4) each
                causal = fn.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], is_causal=True)
                masked = fn.scaled_dot_product_attention(q, k, v, attn_mask=mask[None], scale=0.3)
                return causal[:, 0] + masked * x[..., :1]

        return Attention()

    tmodel, gmodel = pair(build)
    rng = np.random.default_rng(14)
    x, mask = rng.normal(size=(2, 3, 4)), rng.normal(size=(3, 3))
    mask[0, 2] = -np.inf
    prog = glcomp.compile(gmodel, {"x": x.shape, "mask": mask.shape}, loss=nn.MSELoss())
    tout = tmodel(torch.tensor(x), torch.tensor(mask))
    close(prog.runtime("reference").predict(x=x, mask=np.nan_to_num(mask, neginf=-1e30)), tout, "output")
    y = rng.normal(size=(2, 3, 4))
    torch.nn.functional.mse_loss(tout, torch.tensor(y)).backward()
    check_grads(
        prog.runtime("reference"), tmodel, {"x": x, "mask": np.nan_to_num(mask, neginf=-1e30), "y": y}
    )


def test_base_scheduler_without_a_schedule_is_a_clear_error() -> None:
    opt = optim.SGD(lr=0.1)
    with pytest.raises(GlcompError, match=r"LRScheduler defines no schedule"):
        lr_scheduler.LRScheduler(opt)


class HashProbe(nn.Module):
    """The random-number primitive itself on fed operands; b / s makes infinities and NaN where
    s is 0 (inputs themselves must be finite)."""

    def forward(self, a: Any, b: Any, s: Any) -> Any:
        from glcomp.ir.tensor import prim

        return prim("hash_uniform", a, b / s)


def test_hash_uniform_is_bit_exact_on_gl(gl_runtime: Any, dialect: str) -> None:
    """Both dialects' shader hashes (32-bit unsigned integers in GLSL ES 3.00, 12-bit float limbs
    in 1.00) give the reference's values bit for bit, past 2^24, for negative and fractional
    operands, and NaN wherever an operand is not finite."""
    special = [0.0, 1.5, -3.7, 2.0**24 + 5, 1e10, -1e10, 123456.9, 16777215.0, -0.5]
    rng = np.random.default_rng(7)
    a = np.array(special * 3 + list(rng.normal(scale=1e6, size=73)), np.float32)
    b = np.roll(a, 5)
    s = np.where(np.arange(a.size) % 7 == 3, 0.0, 1.0).astype(np.float32)  # b / 0: inf, or NaN at 0
    feeds = {"a": a, "b": b, "s": s}
    prog = glcomp.compile(HashProbe(), {k: v.shape for k, v in feeds.items()}, target=dialect)
    want = prog.runtime("reference").predict(**feeds)
    with gl_runtime(prog) as gl:
        got = gl.predict(**feeds)
    assert np.isnan(want).sum() == (s == 0).sum() > 10
    assert np.array_equal(got, want, equal_nan=True), np.flatnonzero(~((got == want) | np.isnan(want)))[:10]
