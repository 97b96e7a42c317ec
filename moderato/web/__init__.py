"""What every web integration shares, with no web framework: the quota headers, the
JSON bodies of the error responses, and the client-address rules.

The ASGI integration (``moderato.integrations``) and the Django one
(``moderato.django``) both build on these, so a denial reads the same from a
FastAPI route and a Django view, and a forwarded address is believed by the
same rules. Nothing here imports Starlette or Django.
"""
