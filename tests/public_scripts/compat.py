"""Run an unedited public script as ``__main__`` after shimming the Transformers names it was written
against and Transformers 5 removed. The script's file is never copied or changed.

``python -m tests.public_scripts.compat SCRIPT ARGS...``: the script sees ``sys.argv == [SCRIPT, ARGS...]``
and runs through ``runpy`` exactly as ``python SCRIPT ARGS...`` would run it.

The shims (each a rename, none changes what is computed):
- ``transformers.AdamW`` (removed in Transformers 5): ``torch.optim.AdamW`` (run_clm_no_trainer imports it
  and passes its own weight decay per parameter group);
- ``Trainer(tokenizer=...)`` (renamed ``processing_class`` in Transformers 5; run_clm passes it);
- ``accelerate.DistributedType.TPU`` (renamed ``XLA``; run_clm_no_trainer compares with it).
"""

from __future__ import annotations

import runpy
import sys
from typing import Any


def install() -> None:
    import torch
    import transformers

    trainer_init = transformers.Trainer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if "tokenizer" in kwargs:
            kwargs.setdefault("processing_class", kwargs.pop("tokenizer"))
        trainer_init(self, *args, **kwargs)

    transformers.Trainer.__init__ = init  # type: ignore[method-assign]
    from accelerate import DistributedType

    DistributedType._member_map_.setdefault("TPU", DistributedType.XLA)  # renamed XLA in Accelerate 0.29
    # loading Trainer puts a new module object in sys.modules["transformers"]: set the name on that one
    sys.modules["transformers"].AdamW = torch.optim.AdamW


def main() -> None:
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    install()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
