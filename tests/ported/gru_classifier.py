"""A GRU sequence classifier: Embedding, batch-first GRU, the last layer's final hidden state
into a Linear, CrossEntropyLoss, Adam (vocabulary 9, sequences of 6, 3 classes)."""

import torch
import torch.nn as nn


class GRUClassifier(nn.Module):
    def __init__(self, vocab_size, embed_dim, hidden_dim, num_classes):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.gru = nn.GRU(embed_dim, hidden_dim, num_layers=1, batch_first=True)
        self.fc = nn.Linear(hidden_dim, num_classes)

    def forward(self, x):
        embedded = self.embedding(x)
        _, hidden = self.gru(embedded)
        return self.fc(hidden[-1])


def setup():
    model = GRUClassifier(9, 5, 7, 3)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, criterion, optimizer, None
