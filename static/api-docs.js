// Starts Swagger UI on the API docs page (dashboard/web/docs.py) with the schema URL the page
// names. Nothing may leave this origin: no validator badge (validatorUrl), no remote config.
(function () {
  "use strict";
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.dataset.specUrl,
    domNode: root,
    deepLinking: true,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    validatorUrl: null,
    queryConfigEnabled: false,
  });
})();
