"""The SDK: what a program uses to drive desktops through the service."""
