"""Small CNNs for the convolution experiments: a sequential CNN and a small ResNet (pre-defined, built by name).

``SmallResNet``: conv3x3-BN-ReLU stem, then stages of basic residual blocks (conv-BN-ReLU-conv-BN + shortcut,
the first block of a stage downsamples with stride 2 and a 1x1 conv-BN shortcut), global average pooling and a
linear classifier — the ResNet-18 layout of Grishina, Gorbunov and Rakhuba 2024 §6 at a size that trains on a CPU.
"""

from __future__ import annotations

from torch import nn

from spectrakit._checks import check_choice, check_int


class BasicBlock(nn.Module):
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))`` with 3x3 convolutions."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """ResNet with ``len(widths)`` stages of ``blocks`` basic blocks; input ``(N, in_channels, H, W)``.

    ``in_channels``, ``num_classes``, every width and ``blocks`` >= 1. Raises ``TypeError``/``ValueError``.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, widths: tuple[int, ...] = (16, 32, 64),
                 blocks: int = 1):
        super().__init__()
        check_int(in_channels, "in_channels", low=1)
        check_int(num_classes, "num_classes", low=1)
        check_int(blocks, "blocks", low=1)
        if not widths:
            raise ValueError("widths must be a non-empty tuple of ints >= 1")
        for w in widths:
            check_int(w, "widths", low=1)
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, c = [], widths[0]
        for i, w in enumerate(widths):
            for b in range(blocks):
                layers.append(BasicBlock(c, w, stride=2 if (i > 0 and b == 0) else 1))
                c = w
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x):
        return self.fc(self.pool(self.layers(self.stem(x))).flatten(1))


def simple_cnn(in_channels: int = 1, num_classes: int = 10, width: int = 16, image_size: int = 28) -> nn.Sequential:
    """A purely sequential CNN: conv-BN-ReLU, strided conv-BN-ReLU, conv-ReLU, flatten, linear."""
    check_int(width, "width", low=1)
    check_int(image_size, "image_size", low=4)
    half = (image_size + 1) // 2
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(2 * width * half * half, num_classes))


MODELS = {
    "resnet-small": lambda: SmallResNet(1, 10, (16, 32, 64), 1),
    "resnet-tiny": lambda: SmallResNet(1, 10, (8, 16), 1),
    "cnn-small": lambda: simple_cnn(1, 10, 16, 28),
}


def build_model(name: str) -> nn.Module:
    """A built-in model by name (one of :data:`MODELS`); all take ``(N, 1, 28, 28)`` Fashion-MNIST images."""
    check_choice(name, "name", MODELS)
    return MODELS[name]()


# The convolutions of ResNet-18 (He et al. 2016): (out_channels, in_channels, kernel size, stride), one entry per
# distinct layer shape (stem, the 3x3 convolutions of each stage, a 1x1 downsampling shortcut).
RESNET18_CONVS: list[tuple[int, int, int, int]] = [
    (64, 3, 7, 2), (64, 64, 3, 1), (128, 64, 3, 2), (128, 128, 3, 1), (128, 64, 1, 2), (256, 128, 3, 2),
    (256, 256, 3, 1), (512, 256, 3, 2), (512, 512, 3, 1)]
