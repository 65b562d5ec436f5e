"""The DCGAN example's generator and discriminator (ConvTranspose2d, BatchNorm2d, ReLU, Tanh;
Conv2d, LeakyReLU, Sigmoid), weights_init through apply(), BCELoss and Adam(betas=(0.5, 0.999))
(a latent of 4, 1x16x16 images).

torch trains both nets in one loop, accumulating the discriminator's gradients over a real and a
fake batch and reusing the fake batch for the generator's step; glcomp compiles a train step per
optimizer, so the two steps are written as modules: DStep (the fake batch generated and detached
inside, the discriminator's loss on both batches) and GStep (the discriminator's verdict on a
fresh fake batch, scored against the real label).
"""

import torch
import torch.nn as nn
import torch.optim as optim

nz, ngf, ndf, nc = 4, 4, 4, 1
real_label, fake_label = 1.0, 0.0


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class Generator(nn.Module):
    def __init__(self):
        super(Generator, self).__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super(Discriminator, self).__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input)


class DStep(nn.Module):
    def __init__(self, netG, netD):
        super().__init__()
        self.netG, self.netD = netG, netD

    def forward(self, real, noise):
        fake = self.netG(noise)
        return torch.cat([self.netD(real).view(-1), self.netD(fake.detach()).view(-1)])


def d_loss(output, label):
    criterion = nn.BCELoss()
    b = output.size(0) // 2
    return criterion(output[:b], label[:b]) + criterion(output[b:], label[b:])


class GStep(nn.Module):
    def __init__(self, netG, netD):
        super().__init__()
        self.netG, self.netD = netG, netD

    def forward(self, noise):
        return self.netD(self.netG(noise)).view(-1)


def setup():
    netG = Generator()
    netG.apply(weights_init)
    netD = Discriminator()
    netD.apply(weights_init)
    optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999))
    return netG, netD, nn.BCELoss(), optimizerD, optimizerG
