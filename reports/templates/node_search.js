(function () {
  "use strict";
  // The report's one script: a node search over the data block #node-data (results.json's
  // per-node results, compacted). It only reads the page and writes text nodes: no markup from
  // the data is ever parsed, nothing is loaded. Its hash is in the page's Content-Security-Policy.
  var source = document.getElementById("node-data");
  var box = document.getElementById("node-filter");
  var panel = document.getElementById("node-detail");
  if (!source || !box || !panel) { return; }
  // Read on the first search, not at load: a thousand nodes' data is megabytes to parse.
  var data = null, byName = null, matrixRows = null, rowSets = null;
  var SHOWN = 20;

  function load() {
    if (data) { return; }
    data = JSON.parse(source.textContent);
    byName = new Map();
    data.nodes.forEach(function (node) { byName.set(node[0], node); });
    matrixRows = Array.prototype.slice.call(document.querySelectorAll("table.matrix tbody tr[data-rows]"));
    rowSets = matrixRows.map(function (tr) { return new Set(tr.getAttribute("data-rows").split(" ")); });
  }

  function element(tag, className, text) {
    var made = document.createElement(tag);
    if (className) { made.className = className; }
    if (text !== undefined && text !== null) { made.textContent = String(text); }
    return made;
  }

  function number(value) {
    if (typeof value !== "number") { return "—"; }
    if (value === Math.round(value) && Math.abs(value) < 1e6) { return value.toLocaleString("en-US"); }
    return Number(value.toPrecision(3)).toLocaleString("en-US", { maximumSignificantDigits: 3 });
  }

  // "gpu[0001-0003,0007]" -> gpu0001, gpu0002, gpu0003, gpu0007; "a,b" -> a, b.
  function expand(pattern) {
    var parts = [], depth = 0, start = 0, i;
    for (i = 0; i < pattern.length; i++) {
      if (pattern[i] === "[") { depth++; } else if (pattern[i] === "]") { depth--; }
      else if (pattern[i] === "," && depth === 0) { parts.push(pattern.slice(start, i)); start = i + 1; }
    }
    parts.push(pattern.slice(start));
    var names = [];
    parts.forEach(function (part) {
      var match = /^([^\[]*)\[([^\]]*)\](.*)$/.exec(part.trim());
      if (!match) { if (part.trim()) { names.push(part.trim()); } return; }
      match[2].split(",").forEach(function (range) {
        var bounds = range.split("-");
        if (bounds.length === 1) { expand(match[1] + bounds[0] + match[3]).forEach(function (n) { names.push(n); }); return; }
        var low = parseInt(bounds[0], 10), high = parseInt(bounds[1], 10), width = bounds[0].length;
        for (var k = low; k <= high && names.length < 100000; k++) {
          var digits = String(k);
          while (digits.length < width) { digits = "0" + digits; }
          expand(match[1] + digits + match[3]).forEach(function (n) { names.push(n); });
        }
      });
    });
    return names;
  }

  function matching(query) {
    if (byName.has(query)) { return [byName.get(query)]; }
    var named = expand(query).filter(function (name) { return byName.has(name); });
    if (named.length) { return named.map(function (name) { return byName.get(name); }); }
    var lower = query.toLowerCase();
    return data.nodes.filter(function (node) { return node[0].toLowerCase().indexOf(lower) >= 0; });
  }

  // a reason or message, the node's own name put back where the data marks it (NUL)
  function said(text, node) { return data.texts[text].split("\u0000").join(node[0]); }

  function detail(node) {
    var section = element("section", "node-card");
    section.setAttribute("data-node", node[0]);
    var header = element("h3", null, node[0] + " ");
    header.appendChild(element("span", "badge badge-" + node[1], node[1]));
    section.appendChild(header);
    var notes = node[2].map(function (text) { return said(text, node); })
      .concat(node[3].map(function (warning) { return "outlier: " + warning; }));
    if (notes.length) {
      var list = element("ul", "node-notes");
      notes.forEach(function (note) { list.appendChild(element("li", null, note)); });
      section.appendChild(list);
    }
    var table = element("table", "data");
    var head = element("tr");
    ["Check", "Outcome", "Message", "Figures"].forEach(function (title) { head.appendChild(element("th", null, title)); });
    table.appendChild(element("thead")).appendChild(head);
    var body = table.appendChild(element("tbody"));
    node[5].forEach(function (entry) {
      var outcome = data.outcomes[entry[1]];
      var row = element("tr", outcome === "failed" || outcome === "error" ? "bad" : null);
      var name = data.columns[entry[0]] + (entry[2] === null ? "" : " rail " + entry[2]);
      var cell = row.appendChild(element("td", "nowrap"));
      if (entry[4]) {
        var link = cell.appendChild(element("a", null, name));
        link.setAttribute("href", "#" + entry[4]);
      } else { cell.textContent = name; }
      row.appendChild(element("td")).appendChild(element("span", "badge badge-" + outcome, outcome));
      row.appendChild(element("td", "wrap", said(entry[3], node)));
      var figures = row.appendChild(element("td", "wrap"));
      entry[5].forEach(function (figure, index) {
        var metric = data.metrics[figure[0]];
        var text = metric[0] + " " + number(figure[1]) + (metric[1] ? " " + metric[1] : "");
        if (index) { figures.appendChild(document.createTextNode("; ")); }
        figures.appendChild(element("span", figure[2] === false ? "figure-bad" : null, text));
      });
      body.appendChild(row);
    });
    section.appendChild(table);
    return section;
  }

  function show() {
    load();
    var query = box.value.trim();
    while (panel.firstChild) { panel.removeChild(panel.firstChild); }
    if (!query) {
      matrixRows.forEach(function (tr) { tr.hidden = false; });
      panel.hidden = true;
      return;
    }
    var found = matching(query);
    var rows = new Set(found.map(function (node) { return String(node[4]); }));
    matrixRows.forEach(function (tr, index) {
      var keep = false;
      rowSets[index].forEach(function (row) { if (rows.has(row)) { keep = true; } });
      tr.hidden = !keep && !tr.classList.contains("cluster-row");
    });
    panel.hidden = false;
    panel.appendChild(element("p", "muted", found.length ? found.length + " node(s) match" +
      (found.length > SHOWN ? "; the first " + SHOWN + " are shown" : "") : "no node matches " + query));
    found.slice(0, SHOWN).forEach(function (node) { panel.appendChild(detail(node)); });
  }

  box.addEventListener("input", show);
  function fromHash() {
    if (location.hash.indexOf("#node=") === 0) {
      box.value = decodeURIComponent(location.hash.slice(6));
      show();
      box.scrollIntoView();
    }
  }
  window.addEventListener("hashchange", fromHash);
  fromHash();
})();
