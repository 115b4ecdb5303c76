// turnlog inspector: the turn's shape, its spans on one time axis
// (GET /v1/turns/{id}/spans). No inline styles: geometry goes into SVG
// attributes (x, width) set through the DOM, colours come from classes in spans.css.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const WIDTH = 1000; // viewBox units of one track
  const KINDS = {
    assembly: "assembly",
    step: "assembly step",
    model: "model call",
    tool: "tool call",
    approval: "approval wait",
    reinjection: "reinjection",
    outlet: "outlet",
    background: "background task",
  };

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined) continue;
      if (name === "class") node.className = value;
      else if (name === "onclick") node.addEventListener("click", value);
      else node.setAttribute(name, value);
    }
    node.append(...children.filter((c) => c !== null && c !== undefined));
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
    return node;
  }

  function ms(seconds) {
    const v = seconds * 1000;
    if (v < 1) return "<1 ms";
    return v < 1000 ? `${Math.round(v)} ms` : `${(v / 1000).toFixed(2)} s`;
  }

  // What the tooltip and the row's accessible text say about one span.
  function describe(span, start, end) {
    const d = span.detail || {};
    const until = span.end === null ? end : span.end;
    const parts = [
      `${KINDS[span.kind] || span.kind}: ${span.name}`,
      `${span.status}, ${ms(until - span.start)}${span.end === null ? " so far" : ""}`,
      `from +${ms(span.start - start)}`,
      `seq ${span.seq}${span.end_seq ? `–${span.end_seq}` : ""}`,
    ];
    if (span.kind === "model") {
      if (d.first_chunk_ms !== null && d.first_chunk_ms !== undefined) parts.push(`first chunk after ${ms(d.first_chunk_ms / 1000)}`);
      if (d.output_tokens !== null && d.output_tokens !== undefined) parts.push(`${d.input_tokens ?? "?"} in / ${d.output_tokens} out tokens${d.estimated ? " (estimated)" : ""}`);
      if (d.tokens_per_s) parts.push(`${d.tokens_per_s} tokens/s`);
      if (d.finish_reason) parts.push(`finish ${d.finish_reason}`);
    }
    if (d.error) parts.push(`error: ${d.error}`);
    return parts.join(" · ");
  }

  function x(t, start, span) {
    return Math.max(0, Math.min(WIDTH, ((t - start) / span) * WIDTH));
  }

  function bar(span, start, end, total, text) {
    const track = svg("svg", { class: "sp-track", viewBox: `0 0 ${WIDTH} 10`, preserveAspectRatio: "none", "aria-hidden": "true", focusable: "false" });
    const from = x(span.start, start, total);
    const to = x(span.end === null ? end : span.end, start, total);
    const rect = svg("rect", { x: from.toFixed(2), y: 1, width: Math.max(2, to - from).toFixed(2), height: 8, class: `sp-bar k-${span.kind} st-${span.status}` });
    const title = svg("title", {});
    title.textContent = text; // the tooltip over the bar itself
    rect.append(title);
    track.append(rect);
    const first = (span.detail || {}).first_chunk_ms;
    if (span.kind === "model" && typeof first === "number") {
      // the wait for the first chunk, a lighter part at the bar's start
      const wait = x(span.start + first / 1000, start, total) - from;
      track.append(svg("rect", { x: from.toFixed(2), y: 1, width: Math.max(0, Math.min(wait, to - from)).toFixed(2), height: 8, class: "sp-wait" }));
    }
    return track;
  }

  function marksTrack(data, total, onJump) {
    const track = svg("svg", { class: "sp-track sp-marks", viewBox: `0 0 ${WIDTH} 10`, preserveAspectRatio: "none", role: "img", "aria-label": `${data.marks.length} moments` });
    for (const mark of data.marks) {
      const at = x(mark.at, data.start, total);
      const line = svg("rect", { x: Math.min(WIDTH - 3, at).toFixed(2), y: 0, width: 3, height: 10, class: `sp-mark m-${mark.type.replace(/\./g, "-")}` });
      const title = svg("title", {});
      title.textContent = `${mark.type} at +${ms(mark.at - data.start)} (seq ${mark.seq})${mark.detail ? ": " + mark.detail : ""}`;
      line.append(title);
      line.addEventListener("click", () => onJump(mark.seq));
      track.append(line);
    }
    return track;
  }

  function axis(total) {
    return el("div", { class: "sp-axis", "aria-hidden": "true" }, ...[0, 0.25, 0.5, 0.75, 1].map((f) => el("span", {}, `+${ms(total * f)}`)));
  }

  // "model call 2", not "model call model call 2": the kind in bold, once.
  function label(span) {
    const kind = KINDS[span.kind] || span.kind;
    if (span.name.startsWith(kind)) return [el("span", { class: "sp-kind" }, kind), span.name.slice(kind.length)];
    return [el("span", { class: "sp-kind" }, kind), " ", span.name];
  }

  // The chart into `box`; `onJump(seq)` opens that event in the event list.
  function render(box, data, onJump) {
    const start = data.start;
    const end = data.end;
    if (start === null || !data.spans.length) {
      box.replaceChildren(el("p", { class: "empty", id: "spans-chart" }, "Nothing to chart yet."));
      return;
    }
    const total = Math.max(end - start, 0.001);
    // A fork's copy of its parent's events happened at the parent's times: not on this axis.
    const copied = data.spans.filter((span) => span.copied);
    const forked = data.marks.find((m) => m.type === "turn.forked");
    const rows = data.spans.filter((span) => !span.copied).map((span) => {
      const text = describe(span, start, end);
      return el("li", { class: `sp-row k-${span.kind}`, "data-seq": String(span.seq), "data-kind": span.kind, title: text },
        el("button", { type: "button", class: "link sp-label", onclick: () => onJump(span.seq) },
          ...label(span),
          el("span", { class: "muted" }, ` ${ms((span.end === null ? end : span.end) - span.start)}`),
          // a screen reader hears what the tooltip shows (the visible text stays the name's start)
          el("span", { class: "sr-only" }, `. ${text}. Show the event.`)),
        bar(span, start, end, total, text));
    });
    const legend = el("ul", { class: "sp-legend", "aria-label": "Span colours" },
      ...Object.entries(KINDS).filter(([k]) => data.spans.some((s) => s.kind === k)).map(([k, name]) => el("li", { class: `k-${k}` }, name)));
    box.replaceChildren(...[
      el("div", { id: "spans-chart", class: "sp-chart", "data-spans": String(data.spans.length) },
        el("div", { class: "sp-row sp-head" }, el("span", { class: "sp-label muted" }, `${ms(total)} in all · ${data.last_seq} events`), axis(total)),
        data.marks.length ? el("div", { class: "sp-row" }, el("span", { class: "sp-label muted" }, "Moments"), marksTrack(data, total, onJump)) : null,
        el("ol", { class: "sp-rows", "aria-label": "Spans, in the order they began" }, ...rows)),
      copied.length && forked ? el("p", { class: "muted", id: "spans-copied" }, `${copied.length} earlier spans are the parent's, copied into this fork: see `,
        el("a", { href: `/ui/turns/${encodeURIComponent(forked.detail || "")}` }, "the parent's chart"), ".") : null,
      legend].filter((node) => node !== null));
  }

  window.TurnlogSpans = { render, describe };
})();
