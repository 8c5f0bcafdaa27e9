"""Live view: encode a desktop once, fan it out to WebRTC viewers, record it.

Not built yet: see the streaming issue. Nothing here is used by the service today.
"""
