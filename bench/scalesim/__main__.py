from .compare import main

raise SystemExit(main())
