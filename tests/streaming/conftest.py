"""A real X session (Xvfb + D-Bus + xfwm4) for the guest-side streaming tests."""

from tests.desktop.guest.conftest import x_session  # noqa: F401
