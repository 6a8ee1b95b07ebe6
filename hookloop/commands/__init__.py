"""Extra CLI sub-commands: each module here defines ``register(subparsers)``, which adds
its parser and sets ``run=function(args) -> exit code``. ``hookloop.cli`` loads them all.
May import: ``cli`` (to build a run as ``hookloop train`` does) and everything below it."""
