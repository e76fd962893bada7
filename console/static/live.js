// meshfold console: live updates. On the fleet page the server sends the
// fleet's sections as HTML in server-sent events ("fleet"); this swaps them
// in. On a node page it sends the newest sequence once the node has newer
// events ("node"); this offers a reload. No other script runs on any page.
(function () {
  var live = document.getElementById("live");
  var fleet = document.getElementById("fleet");
  if (live && fleet && window.EventSource) {
    var es = new EventSource(live.getAttribute("data-src"));
    es.addEventListener("fleet", function (e) {
      fleet.innerHTML = e.data;
      fleet.setAttribute("data-gen", e.lastEventId);
      live.className = "live on";
    });
    es.onerror = function () { live.className = "live off"; };
  }
  var node = document.getElementById("node-live");
  if (node && window.EventSource) {
    new EventSource(node.getAttribute("data-src")).addEventListener("node", function (e) {
      node.innerHTML = "";
      var a = document.createElement("a");
      a.href = node.getAttribute("data-latest");
      a.textContent = "newer events, up to #" + e.data + ": show them";
      node.appendChild(a);
      node.setAttribute("data-newest", e.data);
    });
  }
})();
