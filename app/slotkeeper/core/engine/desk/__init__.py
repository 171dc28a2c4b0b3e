"""The front desk: which slot or saved conversation serves a request (pure routing and planning),
and the ledger of what each request reused."""
