"""Dealing one training set out to simulated sites: IID (a random deal) or label-skewed non-IID
(each class shared out in Dirichlet(alpha) proportions, the usual benchmark of federated
learning papers). Used by ``glcomp federated simulate`` and the federated examples."""

from __future__ import annotations

import numpy as np

from glcomp.errors import GlcompError

# Draws of a Dirichlet split before giving up on giving every site min_rows rows.
MAX_DRAWS = 100


def parse_partition(text: str) -> tuple[str, float | None]:
    """``"iid"`` -> ("iid", None); ``"dirichlet:ALPHA"`` -> ("dirichlet", ALPHA), ALPHA > 0."""
    if text == "iid":
        return "iid", None
    kind, _, rest = text.partition(":")
    if kind == "dirichlet" and rest:
        try:
            alpha = float(rest)
        except ValueError:
            alpha = float("nan")
        if np.isfinite(alpha) and alpha > 0:
            return "dirichlet", alpha
    raise GlcompError(f"--partition: expected iid or dirichlet:ALPHA with ALPHA > 0, got {text!r}")


def partition(labels: np.ndarray, parts: int, how: str, seed: int, min_rows: int = 1) -> list[np.ndarray]:
    """Disjoint, sorted index sets of ``labels``' rows, one per site. `how`: ``iid`` or
    ``dirichlet:ALPHA`` (labels are class ids; rows of one class are shared out in
    Dirichlet(ALPHA) proportions, a smaller ALPHA skewing the sites more). A Dirichlet split is
    drawn again (at most MAX_DRAWS times, deterministically from `seed`) until every site has at
    least `min_rows` rows (a site needs one whole batch); GlcompError when that never happens."""
    kind, alpha = parse_partition(how)
    y = np.asarray(labels)
    if parts < 1:
        raise GlcompError(f"--clients: expected at least 1 site, got {parts}")
    if parts * min_rows > len(y):
        raise GlcompError(
            f"--clients {parts}: {len(y)} training rows cannot give every site {min_rows} rows (one batch)"
        )
    rng = np.random.default_rng(seed)
    if kind == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(len(y)), parts)]
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise GlcompError(
            f"--partition {how}: needs one integer class label per row, got {y.dtype} {y.shape}"
        )
    classes = np.unique(y)
    for _ in range(MAX_DRAWS):
        out: list[list[int]] = [[] for _ in range(parts)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet([alpha] * parts))[:-1] * len(idx)).astype(int)
            for p, chunk in enumerate(np.split(idx, cuts)):
                out[p].extend(chunk.tolist())
        if min(len(p) for p in out) >= min_rows:
            return [np.sort(np.array(p, np.int64)) for p in out]
    raise GlcompError(
        f"--partition {how}: {MAX_DRAWS} draws never gave each of {parts} sites {min_rows} rows "
        "(one batch); use fewer clients or a larger ALPHA"
    )


__all__ = ["MAX_DRAWS", "parse_partition", "partition"]
