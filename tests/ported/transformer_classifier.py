"""A tiny Transformer encoder classifier: Embedding plus a learned position embedding,
nn.TransformerEncoder of batch-first TransformerEncoderLayers (nn.MultiheadAttention inside),
mean pooling, Linear head, CrossEntropyLoss, AdamW with a cosine schedule."""

import torch
import torch.nn as nn
from torch.optim.lr_scheduler import CosineAnnealingLR


class TransformerClassifier(nn.Module):
    def __init__(
        self, vocab_size=10, d_model=8, nhead=2, num_layers=2, num_classes=3, max_len=6, dropout=0.1
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Parameter(torch.zeros(1, max_len, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model, nhead, dim_feedforward=16, dropout=dropout, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, x):
        h = self.embed(x) + self.pos[:, : x.size(1)]
        h = self.encoder(h)
        return self.head(h.mean(dim=1))


def setup(dropout=0.1):
    model = TransformerClassifier(dropout=dropout)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = CosineAnnealingLR(optimizer, T_max=10)
    return model, criterion, optimizer, scheduler
