"""The names `streaming` exports are pinned, and importing it loads nothing heavy."""

import subprocess
import sys

import streaming


def test_public_names_are_pinned():
    assert streaming.__all__ == [
        "ActionLog",
        "EncodedFrame",
        "FrameHub",
        "LiveDesktops",
        "Recorder",
        "RecordingInfo",
        "Subscription",
    ]
    for name in streaming.__all__:
        assert getattr(streaming, name).__name__ == name


def test_the_guest_side_does_not_import_aiortc():
    code = "import sys, streaming.source; print('aiortc' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
