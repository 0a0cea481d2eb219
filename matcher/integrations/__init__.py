"""Agent frameworks on matcher's worker API: each an optional extra
(``pip install 'matcher[langgraph]'``); importing this package imports none of them."""
