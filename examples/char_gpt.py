"""A character-level GPT: nanoGPT's model code with only the imports changed.

    glcomp train examples/char_gpt.py          # GL runtime; prints the loss and a sample of text
    python examples/char_gpt.py --runtime reference

The model is the decoder-only transformer of nanoGPT's `gpt.py` ("Let's build GPT"): token and
position embeddings, pre-LayerNorm blocks of multi-head causal self-attention (one `Head` module
per head: key/query/value projections, a `torch.tril` buffer, `masked_fill(-inf)`, softmax,
dropout) and a GELU MLP, a final LayerNorm and a linear head over the characters; the loss is the
cross-entropy computed in `forward(idx, targets)`, trained with AdamW. The model code runs
unchanged under torch: only the three imports differ (`import glcomp as torch`,
`from glcomp import nn`, `from glcomp.nn import functional as F`; tests/test_char_gpt.py swaps them
for torch's and compares). Departures from `gpt.py`: GELU in the MLP (as GPT-2; gpt.py has ReLU),
a tiny configuration, and in place of its training loop a `build()` for `glcomp train` (the
compiled train step replaces `loss.backward()` / `optimizer.step()`) and a `generate()` that
samples through the runtime's `predict` (there is no `torch.multinomial` inside the shaders).

The text is `examples/data/coriolanus.txt`: the first 12.9 KB of William Shakespeare's
*Coriolanus* (act 1, scenes 1 and part of 2; public domain), as it opens the "tiny Shakespeare"
corpus of Andrej Karpathy's char-rnn. The first 90% trains, the last 10% is the test set. A
training sample is a window of `block_size` characters; its target is the same window shifted by
one character.

Tiny config, so it trains in well under a minute on llvmpipe: block_size 16, 1 layer of 2 heads,
n_embd 32, batch 32, AdamW lr 3e-3, 200 steps. `glcomp train` then reports the next-character
accuracy and cross-entropy on the test windows and `generate()` samples text from the trained
model through `predict` on the same runtime.

Measured with `glcomp train` on Mesa llvmpipe, 2 vCPUs shared with other jobs (load average 8,
2026-11-30): 11.6 s compiling, 200 steps in 25.5 s (128 ms/step), loss 3.40 after 10 steps and
2.19 after 200, next-character test accuracy 29.9% and cross-entropy 2.52 (a uniform guess over
the text's 58 characters: 4.06).
"""

# ruff: noqa: N806, RUF059  (the torch original's B, T, C spellings, kept as they are)
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

import glcomp as torch
from glcomp import nn
from glcomp.nn import functional as F

# hyperparameters (nanoGPT's gpt.py uses 64, 256, 384, 6, 6 and 0.2 on a GPU)
batch_size = 32  # how many independent sequences will we process in parallel?
block_size = 16  # what is the maximum context length for predictions?
max_iters = 200
learning_rate = 3e-3
n_embd = 32
n_head = 2
n_layer = 1
dropout = 0.0
max_new_tokens = 200  # characters that generate() samples after training
device = "cuda" if torch.cuda.is_available() else "cpu"

TEXT = Path(__file__).resolve().parent / "data" / "coriolanus.txt"
text = TEXT.read_text(encoding="utf-8")
# here are all the unique characters that occur in this text
chars = sorted(set(text))
vocab_size = len(chars)
# create a mapping from characters to integers
stoi = {ch: i for i, ch in enumerate(chars)}
itos = {i: ch for i, ch in enumerate(chars)}
encode = lambda s: [stoi[c] for c in s]  # encoder: take a string, output a list of integers
decode = lambda ids: "".join(itos[int(i)] for i in ids)  # decoder: take a list of integers, output a string


class Head(nn.Module):
    """one head of self-attention"""

    def __init__(self, head_size):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))

        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        # input of size (batch, time-step, channels)
        # output of size (batch, time-step, head size)
        B, T, C = x.shape
        k = self.key(x)  # (B,T,hs)
        q = self.query(x)  # (B,T,hs)
        # compute attention scores ("affinities")
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5  # (B, T, hs) @ (B, hs, T) -> (B, T, T)
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))  # (B, T, T)
        wei = F.softmax(wei, dim=-1)  # (B, T, T)
        wei = self.dropout(wei)
        # perform the weighted aggregation of the values
        v = self.value(x)  # (B,T,hs)
        out = wei @ v  # (B, T, T) @ (B, T, hs) -> (B, T, hs)
        return out


class MultiHeadAttention(nn.Module):
    """multiple heads of self-attention in parallel"""

    def __init__(self, num_heads, head_size):
        super().__init__()
        self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
        self.proj = nn.Linear(head_size * num_heads, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        out = torch.cat([h(x) for h in self.heads], dim=-1)
        out = self.dropout(self.proj(out))
        return out


class FeedFoward(nn.Module):
    """a simple linear layer followed by a non-linearity"""

    def __init__(self, n_embd):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(dropout),
        )

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    """Transformer block: communication followed by computation"""

    def __init__(self, n_embd, n_head):
        # n_embd: embedding dimension, n_head: the number of heads we'd like
        super().__init__()
        head_size = n_embd // n_head
        self.sa = MultiHeadAttention(n_head, head_size)
        self.ffwd = FeedFoward(n_embd)
        self.ln1 = nn.LayerNorm(n_embd)
        self.ln2 = nn.LayerNorm(n_embd)

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        x = x + self.ffwd(self.ln2(x))
        return x


class GPTLanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        # each token directly reads off the logits for the next token from a lookup table
        self.token_embedding_table = nn.Embedding(vocab_size, n_embd)
        self.position_embedding_table = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head=n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)  # final layer norm
        self.lm_head = nn.Linear(n_embd, vocab_size)

        # better init, not covered in the original GPT video, but important, will cover in followup video
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        B, T = idx.shape

        # idx and targets are both (B,T) tensor of integers
        tok_emb = self.token_embedding_table(idx)  # (B,T,C)
        pos_emb = self.position_embedding_table(torch.arange(T, device=device))  # (T,C)
        x = tok_emb + pos_emb  # (B,T,C)
        x = self.blocks(x)  # (B,T,C)
        x = self.ln_f(x)  # (B,T,C)
        logits = self.lm_head(x)  # (B,T,vocab_size)

        if targets is None:
            loss = None
        else:
            B, T, C = logits.shape
            logits = logits.view(B * T, C)
            targets = targets.view(B * T)
            loss = F.cross_entropy(logits, targets)

        return logits, loss


# -- data and glcomp train -------------------------------------------------------------------------
def windows(ids: np.ndarray, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Every `block_size` window of `ids` (start positions `stride` apart) and its targets, the
    window shifted by one character: (N, block_size) float32 ids and int32 targets."""
    starts = np.arange(0, len(ids) - block_size, stride)
    x = np.stack([ids[s : s + block_size] for s in starts])
    y = np.stack([ids[s + 1 : s + block_size + 1] for s in starts])
    return x.astype(np.float32), y.astype(np.int32)


def generate(runtime: Any, context: str, max_new_tokens: int, seed: int = 0, temperature: float = 1.0) -> str:
    """`context` followed by `max_new_tokens` characters sampled one at a time from the model's
    next-character distribution, as nanoGPT's `generate` does, with `runtime.predict` on the last
    `block_size` characters (shorter contexts are padded on the left with the first character).
    Works on any runtime of the compiled model (GL or reference); the compiled batch is filled
    with copies of the context and row 0 is used."""
    rng = np.random.default_rng(seed)
    ids = encode(context)
    for _ in range(max_new_tokens):
        window = ids[-block_size:]
        window = [window[0]] * (block_size - len(window)) + window
        feed = np.tile(np.asarray(window, np.float32), (batch_size, 1))
        logits = np.asarray(runtime.predict(idx=feed), np.float64)[0, -1] / temperature  # (vocab_size,)
        probs = np.exp(logits - logits.max())
        ids.append(int(rng.choice(vocab_size, p=probs / probs.sum())))
    return decode(ids)


def build() -> dict[str, Any]:
    """What ``glcomp train`` needs. The loss is computed in forward (``loss="forward"``), so the
    target's shape and class count are given as ``target_spec``."""
    torch.manual_seed(1337)
    data = np.asarray(encode(text), np.int64)
    n = int(0.9 * len(data))  # first 90% will be train, rest val
    x_train, y_train = windows(data[:n])
    x_test, y_test = windows(data[n:], stride=block_size)
    model = GPTLanguageModel()
    return {
        "model": model,
        "inputs": {"idx": (batch_size, block_size)},
        "loss": "forward",
        "target_name": "targets",
        "target_spec": {"shape": (batch_size, block_size), "dtype": "int32", "num_classes": vocab_size},
        "optimizer": torch.optim.AdamW(model.parameters(), lr=learning_rate),
        "data": {
            "x_train": x_train,
            "y_train": y_train,
            "x_test": x_test,
            "y_test": y_test,
            "vocab": np.array([ord(c) for c in chars], np.int64),  # lets the browser demo decode samples
        },
        "batch_size": batch_size,
        "epochs": 1,
        "steps": max_iters,
        "seed": 1337,
        "sample": lambda rt: generate(rt, "MENENIUS:\n", max_new_tokens),
    }


if __name__ == "__main__":
    from glcomp.cli import main

    sys.exit(main(["train", __file__, *sys.argv[1:]]))
