"""The command-line options of the paper experiments (``spectrakit experiment NAME``), one function per
experiment, defined without importing torch so that ``--help`` and argument errors answer at once. Each
experiment module uses its function as its ``add_arguments``; the names the options accept are those of the
modules' own tables (a test keeps them equal)."""

from __future__ import annotations

import argparse

from spectrakit._cliargs import positive_int

SPIKE_NOISE_METHODS = ("sgd", "sgd+global_clip", "sgd+spectral_clip", "sgdm", "sgdm+pre_clip")
CONV_REGULARIZERS = ("none", "f4", "tn", "2norm", "ratio")
FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
XOR_SETS = ("psd", "spectrahedron", "ball")
XOR_WIDTHS = (16, 32, 64, 128)
XOR_LRS = (0.015625, 0.03125, 0.0625, 0.125, 0.25, 0.5, 1.0, 2.0)
GROKKING_DUALIZERS = ("naive", "alternating1", "pdhg")


def fw_logistic(parser: argparse.ArgumentParser) -> None:
    """Command-line options of the experiment (``--out`` is added by the experiment CLI)."""
    parser.add_argument("--d", type=int, default=10, help="matrix size d (X is d x d)")
    parser.add_argument("--n", type=int, default=80, help="training samples")
    parser.add_argument("--n-test", type=int, default=200, help="test samples")
    parser.add_argument("--noise", type=float, default=5.0, help="label noise sigma")
    parser.add_argument(
        "--bs", type=float, nargs="+", default=[0.0, 0.1, 1.0],
        help="strengths b of the Frobenius regulariser b/2 ||X||_F^2"
    )
    parser.add_argument("--D2s", type=float, nargs="+", default=[0.2, 1.0, 5.0],
                        help="radii D2 of the spectral-norm ball ||X||_2 <= D2")
    parser.add_argument("--steps", type=int, default=2000, help="iterations K")
    parser.add_argument("--batch", type=int, default=20, help="batch size of the stochastic run (D2 = 1)")
    parser.add_argument("--ref-iters", type=int, default=3000, help="FISTA iterations for F*")
    parser.add_argument("--seed", type=int, default=0, help="random seed of data and runs")
    parser.add_argument("--family", action="store_true",
                        help="run composite Frank-Wolfe with the regularizers of --regularizers instead "
                             "(post='spectral_lmo'; --b-values, --radii, --steps apply; default steps 1000)")
    parser.add_argument("--regularizers", nargs="+", default=["frobenius", "nuclear", "schatten", "entropy"],
                        choices=["frobenius", "nuclear", "schatten", "entropy"],
                        help="regularizers of the --family run")
    parser.add_argument("--p", type=float, default=3.0, help="Schatten exponent p of the --family run")


def spike_noise(parser: argparse.ArgumentParser) -> None:
    """Command-line options of the experiment (``--out`` is added by the experiment CLI)."""
    parser.add_argument("--d", type=int, default=50, help="matrix size d")
    parser.add_argument("--n", type=int, default=100, help="training samples")
    parser.add_argument(
        "--noises", type=float, nargs="+", default=[10.0, 100.0, 1000.0], help="spike sizes l"
    )
    parser.add_argument("--rank", type=int, default=1, help="rank r of the spike noise, 1 <= r <= d")
    parser.add_argument("--steps", type=int, default=1000, help="iterations")
    parser.add_argument(
        "--lrs", type=float, nargs="+", default=[2.0**k for k in range(-8, 3)], help="eta_0 grid"
    )
    parser.add_argument("--methods", nargs="+", default=list(SPIKE_NOISE_METHODS), choices=list(SPIKE_NOISE_METHODS),
                        help="update rules to compare")
    parser.add_argument("--seed", type=int, default=0, help="random seed")


def conv_regularization(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--regularizers", default=",".join(CONV_REGULARIZERS),
                        help="comma-separated regularizers to train with")
    parser.add_argument("--epochs", type=int, default=2, help="training epochs per regularizer")
    parser.add_argument("--train-size", type=int, default=4000, help="training images used")
    parser.add_argument("--test-size", type=int, default=2000, help="test images used")
    parser.add_argument("--batch-size", type=int, default=128, help="images per batch")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--weight-decay", type=float, default=5e-4, help="SGD weight decay")
    parser.add_argument("--beta", type=float, default=1e-3, help="weight of the spectral regularizer")
    parser.add_argument("--widths", default="8,16,32", help="comma-separated channel widths of the ResNet stages")
    parser.add_argument("--track-layer", default="layers.1.conv2",
                        help="conv layer whose TN bound is tracked per epoch")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--device", default="auto",
                        help="cpu, cuda or auto (cuda when available)")
    parser.add_argument("--root", default=FASHION_MNIST_ROOT, help="folder with the Fashion-MNIST IDX files")


def conv_bounds(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--channels", default="64,128,256,512", help="comma-separated channel counts")
    parser.add_argument("--kernel-sizes", default="3,5,7", help="comma-separated kernel sizes")
    parser.add_argument("--input-size", type=int, default=32, help="spatial size n of the n x n input")
    parser.add_argument("--iters", type=int, default=100, help="HOPM sweeps")
    parser.add_argument("--exact-iters", type=int, default=100, help="power iterations for the exact value")
    parser.add_argument("--samples", type=int, default=1, help="Gaussian kernels per row (means are reported)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the kernels")
    parser.add_argument("--device", default="auto",
                        help="cpu, cuda or auto (cuda when available)")


def xor_transfer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--widths", type=int, nargs="+", default=list(XOR_WIDTHS),
                        help="CPU default; the paper's sweep is 16 64 256 1024 (GPU-sized)")
    parser.add_argument("--lrs", type=float, nargs="+", default=list(XOR_LRS), help="learning rates swept")
    parser.add_argument("--sets", nargs="+", default=list(XOR_SETS), choices=XOR_SETS, help="constraint sets compared")
    parser.add_argument("--steps", type=int, default=32, help="training steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="random seeds")
    parser.add_argument("--dualizer", default="pdhg", choices=["naive", "alternating", "pdhg", "dual_ascent"],
                        help="how the steepest-descent direction is dualised")
    parser.add_argument("--dualizer-steps", type=int, default=4, help="iterations of the dualizer")
    parser.add_argument("--method", default="polar", choices=["polar", "exact"],
                        help="matrix functions by polar iterations or exact SVD/eigh")


def grokking(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dualizers", nargs="+", default=list(GROKKING_DUALIZERS), choices=list(GROKKING_DUALIZERS),
                        help="dualizers compared")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="random seeds")
    parser.add_argument("--width", type=int, default=64, help="hidden width of the MLP")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate")
    parser.add_argument("--radius", type=float, default=4.0, help="radius of the spectral constraint set")
    parser.add_argument("--momentum", type=float, default=0.9, help="momentum")
    parser.add_argument("--max-steps", type=positive_int, default=1500, help="training steps at most")
    parser.add_argument("--train-fraction", type=float, default=0.8, help="share of the pairs used for training")
