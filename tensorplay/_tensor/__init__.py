# SPDX-License-Identifier: Apache-2.0
"""The tensor core: the compiled ``TensorBase`` (``base``), DLPack capsules
(``dlpack``), the Tensor class with creation and transfers (``tensor``) and
interop with other libraries' arrays (``interop``)."""
