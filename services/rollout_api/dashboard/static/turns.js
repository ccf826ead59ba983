// One trajectory's turns: the model's message, its command, the observation, per-turn timings, and the
// generated tokens as a heat map of the engine's logprobs (loss-masked tool tokens shown greyed).
"use strict";

const MAX_TOKENS_SHOWN = 4000; // per turn; the rest is summarised

const Turns = {
  render(t, texts) {
    const replies = Turns.pairs(t.messages || []);
    return t.turns.map((turn, i) => Turns.card(t, turn, replies[i] || {}, texts, t.turns[i + 1]));
  },

  // [{assistant, next}] in order: the model's message and the user/tool message that followed it
  pairs(messages) {
    const out = [];
    messages.forEach((m, i) => {
      if (m.role === "assistant") out.push({ assistant: m.content, next: messages[i + 1] ? messages[i + 1].content : null });
    });
    return out;
  },

  card(t, turn, reply, texts, nextTurn) {
    const command = reply.assistant ? Turns.command(reply.assistant) : null;
    const end = nextTurn ? nextTurn.response_offset : t.response_ids.length;
    return el("div.card.turn", { dataset: { turn: turn.index } },
      el("div.turn-head", {},
        el("span.turn-index", {}, `Turn ${turn.index + 1}`),
        el("span.chip", {}, ver(turn.weight_version)), el("span.chip.mono", {}, turn.engine_id),
        el("span.chip", { dataset: { timing: "llm" } }, `LLM ${Fmt.secs(turn.llm_s)} s`),
        el("span.chip", { dataset: { timing: "exec" } }, `exec ${Fmt.secs(turn.exec_s)} s`),
        turn.exit_code === null ? null : el(`span.chip.${turn.exit_code === 0 ? "ok" : "bad"}`, {}, `exit ${turn.exit_code}`),
        el("span.chip", {}, `${turn.prompt_tokens} → ${turn.response_tokens} tok`),
        turn.cached_tokens ? el("span.chip", {}, `${turn.cached_tokens} cached`) : null,
        el("span.chip", {}, turn.finish_reason)),
      reply.assistant ? el("div.block", {}, el("div.block-label", {}, "model"), el("pre.wrap.message", {}, reply.assistant)) : null,
      command ? el("div.block", {}, el("div.block-label", {}, "command"), el("pre.wrap.command", { dataset: { command: "" } }, command)) : null,
      reply.next ? el("div.block", {}, el("div.block-label", {}, "observation"), el("pre.wrap.observation", {}, reply.next)) : null,
      el("details", { open: turn.index === 0 ? true : null }, el("summary", {}, "tokens · logprob heat map · loss mask"),
        Turns.heat(t, turn.response_offset, end, texts)));
  },

  command(text) {
    const m = text.match(/```(?:bash|sh)?\s*\n([\s\S]*?)```/);
    return m ? m[1].replace(/\n$/, "") : null;
  },

  heat(t, start, end, texts) {
    const box = el("div.tokens");
    const stop = Math.min(end, start + MAX_TOKENS_SHOWN);
    for (let i = start; i < stop; i++) {
      const masked = t.loss_mask[i] === 0;
      const lp = t.response_logprobs[i];
      const text = texts ? texts[i] : `${t.response_ids[i]} `;
      const span = el("span.tok" + (masked ? ".masked" : ""), {
        title: `#${i} id ${t.response_ids[i]} · ` + (masked ? "mask 0 (tool output, not trained on)" : `logprob ${lp.toFixed(3)} · p ${Math.exp(lp).toFixed(3)} · mask 1`),
      }, Turns.visible(text));
      if (!masked) span.style.background = Turns.colour(lp);
      box.append(span);
    }
    if (end > stop) box.append(el("span.dim", {}, ` … ${end - stop} more tokens`));
    return box;
  },

  visible(text) { return text.replace(/\n/g, "↵\n").replace(/\t/g, "⇥\t"); },

  // p = exp(logprob): red (unlikely) -> amber -> green (certain)
  colour(lp) {
    const p = Math.min(1, Math.max(0, Math.exp(lp)));
    const hue = Math.round(120 * p);
    return `hsla(${hue}, 75%, 45%, ${0.55 - 0.3 * p})`;
  },

  legend(haveTexts) {
    const stops = [-6, -3, -1.5, -0.7, -0.2, 0].map((lp) => el("span.tok", { style: { background: Turns.colour(lp) } }, `p ${Math.exp(lp).toFixed(2)}`));
    return el("div.card.legend", {}, el("span.dim", {}, "heat map: engine probability of each generated token "),
      ...stops, el("span.tok.masked", {}, "tool output (mask 0)"),
      haveTexts ? null : el("span.dim", {}, " · no tokenizer configured (ROLLOUT_API_TOKENIZER_PATH): showing token ids"));
  },
};
