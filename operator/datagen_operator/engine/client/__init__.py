"""The one SGLang HTTP client: `policy` (pure retry/verdict rules, errors), `reads` (health, /server_info,
the parser probe, the session), `pool` (endpoints up/down), `generate` (POST /generate).
"""
