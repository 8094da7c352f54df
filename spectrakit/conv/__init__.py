"""Spectral norms of convolutional layers (Grishina, Gorbunov and Rakhuba 2024): the tensor-norm (TN) bound by complex
HOPM with warm
starts and an analytic gradient, the F4 bound, exact references (circular FFT, zero-padding power iteration,
Gram iteration, LipBound), training regularizers and a model Lipschitz report."""

from spectrakit.conv.dense import dense_jacobian
from spectrakit.conv.exact import exact_circular, exact_zero_pad, gram_bound, lipbound
from spectrakit.conv.kernel import effective_kernel, strided_reshape
from spectrakit.conv.regularizers import ConvRegularizer, TNRegularizer, channel_gram_kernel
from spectrakit.conv.report import lipschitz_report
from spectrakit.conv.tensor_norm import TNState, tensor_spectral_norm, tn_bound
from spectrakit.conv.unfolding_bound import f4_bound

__all__ = ["tn_bound", "tensor_spectral_norm", "TNState", "f4_bound", "exact_circular", "exact_zero_pad",
           "gram_bound", "lipbound", "dense_jacobian", "effective_kernel", "strided_reshape", "ConvRegularizer",
           "TNRegularizer", "channel_gram_kernel", "lipschitz_report"]
