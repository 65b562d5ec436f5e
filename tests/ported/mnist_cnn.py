"""The MNIST example's CNN: conv/relu/pool, Dropout2d and Dropout, log_softmax + nll_loss,
Adadelta with StepLR (images shrunk to 1x10x10)."""

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR


class Net(nn.Module):
    def __init__(self, p1=0.25, p2=0.5):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.dropout1 = nn.Dropout2d(p1)
        self.dropout2 = nn.Dropout(p2)
        self.fc1 = nn.Linear(72, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def setup(dropout=True):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Net() if dropout else Net(0.0, 0.0)
    model = model.to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    return model, F.nll_loss, optimizer, scheduler
