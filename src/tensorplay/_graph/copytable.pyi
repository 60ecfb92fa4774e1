# SPDX-License-Identifier: Apache-2.0
COPY_CAPACITIES: tuple[int, ...]
