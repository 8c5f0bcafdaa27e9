"""Inside a sandbox: capture, the pointer, H.264 encode and the frame source the live view reads."""
