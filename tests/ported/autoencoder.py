"""A dense autoencoder: encoder/decoder Sequentials, MSELoss against the input, Adam with
weight decay (20 inputs, a code of 3)."""

import torch
from torch import nn


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(20, 12),
            nn.ReLU(True),
            nn.Linear(12, 6),
            nn.ReLU(True),
            nn.Linear(6, 3),
        )
        self.decoder = nn.Sequential(
            nn.Linear(3, 6),
            nn.ReLU(True),
            nn.Linear(6, 12),
            nn.ReLU(True),
            nn.Linear(12, 20),
            nn.Sigmoid(),
        )

    def forward(self, x):
        encoded = self.encoder(x)
        decoded = self.decoder(encoded)
        return decoded


def setup():
    model = AutoEncoder()
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-5)
    return model, criterion, optimizer, None
