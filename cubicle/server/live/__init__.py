"""Live view: encode a desktop once, fan it out to viewers, record it.

Two sides, imported by their module names:

- in the guest (inside the sandbox): `capture` (DAMAGE-driven grabs), `pointer` (the
  pointer followed through XInput 2 and XFixes, and drawn into pictures), `encoder`
  (libx264), `source` (one encoder for every reader of `GET /frames`), and `frames`, the
  wire between the two sides. These import nothing of the control plane.
- on the host: `hub` (one reader per desktop, a bounded queue per subscriber), `webrtc`
  (aiortc peers sending the packets as they are), `mjpeg` (the fallback), `control` and
  `keys` (browser input), `recording` (MP4 without re-encoding, with an action log), `live`
  (all of it per desktop) and `api` (the routes and `LiveRoom`, which mounts them on the
  service).

This package's `__init__` imports nothing, so the guest pays only for its own side.
"""
