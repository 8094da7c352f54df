import pytest
import torch

from spectrakit.models.cnn import MODELS, SmallResNet, build_model, simple_cnn


@pytest.mark.parametrize("name", sorted(MODELS))
def test_builtin_models_forward_backward(name):
    model = build_model(name)
    out = model(torch.randn(3, 1, 28, 28))
    assert out.shape == (3, 10)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_resnet_shapes_and_downsampling():
    m = SmallResNet(3, 5, (4, 8, 16), blocks=2)
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 5)
    strides = [c.stride for c in m.modules() if isinstance(c, torch.nn.Conv2d)]
    assert strides.count((2, 2)) == 4        # two downsampling blocks: conv1 + 1x1 shortcut each


@pytest.mark.parametrize("kw,exc", [({"widths": ()}, ValueError), ({"blocks": 0}, ValueError),
                                    ({"in_channels": 1.5}, TypeError)])
def test_bad_args(kw, exc):
    with pytest.raises(exc):
        SmallResNet(**kw)
    with pytest.raises(ValueError, match="name"):
        build_model("vgg")
    with pytest.raises(ValueError):
        simple_cnn(width=0)
