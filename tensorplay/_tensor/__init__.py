# SPDX-License-Identifier: Apache-2.0
"""The tensor core: the compiled ``TensorBase`` (``base``) and DLPack capsules
(``dlpack``); the argument helpers (``args``); host and device copies,
``tensorplay.cuda.synchronize`` and what the core receives from above
(``transfer``); the Tensor class with the copies and fills its methods make
(``tensor``); making tensors (``creation``); and interop with other
libraries' arrays (``interop``)."""
