"""Stand-in for the `guestfs` module (libguestfs's Python bindings) for the unpacked lava-dispatcher.

Why: lava_dispatcher/actions/deploy/apply_overlay.py and utils/filesystem.py `import guestfs` at
module level, so lava-run cannot even start without it. The real module only comes from Debian's
python3-guestfs (not on PyPI, and it drags in libguestfs and supermin). LAVA uses it only to put
overlays into disk images; fraglab's jobs boot a kernel and an initramfs (deploy to: tmpfs), which
never reach it. scripts/python-tools puts this file on PYTHONPATH; a job that does need guestfs
fails with the error below instead of doing something half-way.
"""


class GuestFS:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(
            "guestfs stub (fraglab scripts/lava/guestfs.py): libguestfs is not available; "
            "disk-image overlays are not supported by scripts/lava-run"
        )
