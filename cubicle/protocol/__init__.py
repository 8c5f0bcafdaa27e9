"""The guest protocol both sides speak (docs/protocol.md).

`actions`: the input actions, one discriminated union on `type`. `models`: the guest's
request and answer models. `errors`: the one error tree, its status table and `ErrorBody`.
This package imports only the standard library and pydantic: the guest daemon, the control
plane and the SDK all load it.
"""
