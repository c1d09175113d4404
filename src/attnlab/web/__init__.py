"""The local attention explorer: ``attnlab explore RUN_DIR`` serves one offline page (no CDN).

``model_adapter`` turns a run folder into what the page shows (attention maps, next-token guesses);
``server`` is the FastAPI app with its limits (request size, input length, time, queue);
``static/`` holds the hand-written page, script and style sheet.
"""
