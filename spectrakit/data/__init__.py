"""Offline datasets and corpora: text corpora from the Python install and Debian packages, Fashion-MNIST.

- :mod:`spectrakit.data.corpora`   named corpora (``stdlib`` built in; ``linux-doc``, ``gcide``, ...)
- :mod:`spectrakit.data.tokenizer` raw bytes or a byte-level BPE trained with ``tokenizers``
- :mod:`spectrakit.data.tokens`    tokenise once into memory-mapped uint16 files with a validation split
- :mod:`spectrakit.data.batches`   reproducible random training windows and validation windows
"""
