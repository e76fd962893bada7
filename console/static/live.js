// meshfold console: live updates of the fleet page. The server sends the
// fleet's sections as HTML in server-sent events ("fleet"); this swaps them
// in. No other script runs on any page.
(function () {
  var live = document.getElementById("live");
  var fleet = document.getElementById("fleet");
  if (!live || !fleet || !window.EventSource) { return; }
  var es = new EventSource(live.getAttribute("data-src"));
  es.addEventListener("fleet", function (e) {
    fleet.innerHTML = e.data;
    fleet.setAttribute("data-gen", e.lastEventId);
    live.className = "live on";
  });
  es.onerror = function () { live.className = "live off"; };
})();
