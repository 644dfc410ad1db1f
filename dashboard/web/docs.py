"""The API docs page: Swagger UI, vendored under static/vendor/, under the same CSP as every
other page. Litestar's own render plugins load their UI from a CDN and write inline
<script> and <style>; this one's HTML names only files on our origin, and static/api-docs.js
starts the UI on the schema URL it reads from a data- attribute."""

from __future__ import annotations

from html import escape
from typing import Any

from litestar import Request
from litestar.openapi.plugins import OpenAPIRenderPlugin

SWAGGER_UI = "/static/vendor/swagger-ui-5.35.0"


class SwaggerUIPage(OpenAPIRenderPlugin):
    def __init__(self) -> None:
        super().__init__(path="/", favicon="", style="")

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        title = escape(openapi_schema["info"]["title"])
        spec = escape(self.get_openapi_json_route(request))
        return f"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{title}</title>
  <link rel="icon" type="image/png" href="{SWAGGER_UI}/favicon-32x32.png">
  <link rel="stylesheet" href="{SWAGGER_UI}/swagger-ui.css">
  <script src="{SWAGGER_UI}/swagger-ui-bundle.js" defer></script>
  <script src="/static/api-docs.js" defer></script>
</head>
<body>
  <noscript>The API docs need JavaScript; the schema itself is at <a href="{spec}">{spec}</a>.</noscript>
  <div id="swagger-ui" data-spec-url="{spec}"></div>
</body>
</html>
""".encode()
