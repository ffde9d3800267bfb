#!/usr/bin/env bash
# Conv2D, the 2-D poolings and their gradients equal PyTorch's CPU conv/pool
# forward and autograd on fixed inputs (conv_torch.py, through `dg eval`):
# float64 at 1e-10, the LeNet shapes of issue 18 in float32 at 2e-5. Skips
# with a line where Debian's python3-torch is absent.
# Usage: test_conv_torch.sh PATH/TO/dg   (meson passes it)
set -uo pipefail
DG=${1:?usage: test_conv_torch.sh PATH/TO/dg}
exec /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/conv_torch.py" "$DG"
