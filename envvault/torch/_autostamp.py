"""Imported at interpreter start by the ``envvault_stamp.pth`` hook, and only when ``ENVVAULT_STAMP=1``.

Stamping turns on once torch is imported: this module only puts a finder in front of ``sys.meta_path``
that notices ``import torch`` and, once torch has executed, calls :func:`envvault.torch.plugin.enable`.
It imports nothing itself, so a process that never imports torch pays next to nothing.
"""

import sys


class _OnTorchImport:
    """Finds nothing; lets the real finders find ``torch``, then enables stamping after it executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # one shot, and out of the way of the search below
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_enable(module):
            exec_module(module)
            try:
                from envvault.torch.plugin import enable

                enable()
            except Exception as err:  # noqa: BLE001 - importing torch must never fail because of stamping
                sys.stderr.write(f"envvault: checkpoint stamping is off: {type(err).__name__}: {err}\n")

        try:
            loader.exec_module = exec_then_enable  # this loader object serves this one module only
        except (AttributeError, TypeError):
            pass
        return spec


if "torch" in sys.modules:
    from envvault.torch.plugin import enable

    enable()
else:
    sys.meta_path.insert(0, _OnTorchImport())
