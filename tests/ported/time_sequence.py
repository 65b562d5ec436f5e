"""The time-sequence prediction example: two LSTMCells looped over time, outputs joined with
torch.cat, in double precision as written. The original trains with LBFGS, which glcomp does not
have (it needs a closure that re-evaluates the loss); Adam takes its place here."""

import torch
import torch.nn as nn
import torch.optim as optim


class Sequence(nn.Module):
    def __init__(self):
        super(Sequence, self).__init__()
        self.lstm1 = nn.LSTMCell(1, 6)
        self.lstm2 = nn.LSTMCell(6, 6)
        self.linear = nn.Linear(6, 1)

    def forward(self, input, future=0):
        outputs = []
        h_t = torch.zeros(input.size(0), 6, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 6, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 6, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 6, dtype=torch.double)

        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for i in range(future):  # if we should predict the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        outputs = torch.cat(outputs, dim=1)
        return outputs


def setup():
    seq = Sequence()
    seq.double()
    criterion = nn.MSELoss()
    optimizer = optim.Adam(seq.parameters(), lr=0.05)
    return seq, criterion, optimizer, None
