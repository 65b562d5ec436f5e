"""The "classifying names with a character-level RNN" tutorial: an RNN cell built from two
Linear layers on torch.cat((input, hidden), 1) and LogSoftmax, one-hot letters of shape
(T, 1, n_letters), NLLLoss on the last output, SGD. The tutorial loops over the letters in
train(); here the same loop sits in a module's forward, which is what glcomp compiles."""

import torch
import torch.nn as nn

n_letters = 8
n_hidden = 12
n_categories = 4


class RNN(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super(RNN, self).__init__()

        self.hidden_size = hidden_size

        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.h2o = nn.Linear(input_size + hidden_size, output_size)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, input, hidden):
        combined = torch.cat((input, hidden), 1)
        hidden = self.i2h(combined)
        output = self.h2o(combined)
        output = self.softmax(output)
        return output, hidden

    def initHidden(self):
        return torch.zeros(1, self.hidden_size)


class NameClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = RNN(n_letters, n_hidden, n_categories)

    def forward(self, line_tensor):
        hidden = self.rnn.initHidden()
        for i in range(line_tensor.size()[0]):
            output, hidden = self.rnn(line_tensor[i], hidden)
        return output


def setup():
    model = NameClassifier()
    criterion = nn.NLLLoss()
    learning_rate = 0.05
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    return model, criterion, optimizer, None
