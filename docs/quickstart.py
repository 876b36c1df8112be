# %% [markdown]
# # tformer in a notebook: trace, head view, ablate a head, logit lens
#
# Two real models, both offline (installed with the project): MiniLM, an encoder, and SmolLM2-135M, a language
# model. Open this file in VS Code or Jupyter (with Jupytext: `jupytext --to notebook docs/quickstart.py`) and run
# it cell by cell: a cell whose last line is a view draws it inline. Or run it whole, on the CPU, from the project's
# folder: `.venv/bin/python docs/quickstart.py` prints the numbers (a few seconds; the first use of SmolLM2 on a
# machine converts it from its GGUF file once, 20 to 40 s more). `tests/views/test_quickstart.py` runs it and
# checks what it prints. The core's API in full: docs/api.md.

# %%
import tformer_core as tc
from tformer_core.interventions import Head, ablate_heads
from tformer_core.lens import logit_lens
from tformer_views import notebook, search
from tformer_views.head_matters import lens_frame
from tformer_views.tokens import display_token

# %% [markdown]
# ## Trace a sentence
#
# One forward pass of MiniLM with everything captured: Q, K, V, scores and weights of every head, the residual
# stream, the FFN. `trace.names` lists what it holds; `trace.attention(layer, head)` is one head's weights.

# %%
minilm = tc.load_model("minilm")
trace = minilm.trace("The animal didn't cross the street because it was too tired.")
it, animal = trace.tokens.index("it"), trace.tokens.index("animal")
trace.tokens

# %% [markdown]
# Which head links "it" to "animal" most? The weight "it" gives "animal" in every head of every layer, ranked.

# %%
rows = search.query_rows(trace, it)  # [layers, heads, tokens]: the attention of "it" in every head
layer, head, weight = search.ranked_heads(rows[..., animal], top=1)[0]
print(f'MiniLM, layer {layer}, head {head}: "it" gives "animal" {weight:.2f} of its attention')

# %% [markdown]
# ## The head view of that head
#
# A line from each token (left) to each token it attends to (right), its opacity the weight. In JupyterLab it is
# live (hover a token to see only its lines); elsewhere it is drawn as a picture. `notebook.heatmap(trace, layer,
# head)` shows the same weights as a matrix.

# %%
view = notebook.head_view(trace, layer, heads=[head])
view

# %% [markdown]
# ## Ablate a head and see the prediction change
#
# SmolLM2 completes "The capital of France is" with " Paris". Head 4 of layer 23 is the head that matters most for
# it: switched off (its output z set to 0 for this one call; the model itself is never changed) the probability
# of " Paris" falls from 0.77 to 0.14. The app's *Does this head matter?* page finds that head by ablating every
# head in one batched pass (`tformer_core.probes.head_importance`, docs/api.md).

# %%
llm = tc.load_model("smollm2")
prompt = "The capital of France is"
clean = llm.trace(prompt)
ablated = llm.trace(prompt, edits=ablate_heads([Head("decoder", 23, 4)]))  # for this call only
before, after = clean.predictions(k=3), ablated.predictions(k=3)  # [(token, probability)], the top 3
print("before:", ", ".join(f"{display_token(token)} {p:.2f}" for token, p in before))  # "␣Paris": " Paris"
print("head 23.4 ablated:", ", ".join(f"{display_token(token)} {p:.2f}" for token, p in after))

# %% [markdown]
# ## The logit lens
#
# The residual stream read with the model's own final norm and unembedding after every layer: what the model
# would say if it stopped there. " Paris" is far down the list until the last few layers (its rank: 0 = first).

# %%
lens = logit_lens(llm, clean, k=3)
ranks = dict(zip(lens.layers, lens.rank.tolist()))
print("rank of ' Paris' after layers 22 to 29:", [ranks[str(layer)] for layer in range(22, 30)])
lens_frame(lens).tail(8)
